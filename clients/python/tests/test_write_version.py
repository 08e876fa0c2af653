"""A trainer's named tensors as a new version (write_version.py, the trainer side of the vLLM
backend ``weightd`` without vLLM) against a real host daemon: only the named tensors' segments
are copied, the version written over keeps its bytes, and every refusal (a name the daemon does
not hold, another dtype, a shape that is neither a rank's piece nor the whole tensor) and a
failure mid-way leave nothing committed and no copy open; at tp > 1 whole tensors give each rank
its piece."""

import json
import os
import socket

import pytest

from daemon_fixture import DEVICE, Daemon
from test_host_fds import MODEL
from test_switch import ctl, wait_for
from test_update import update_memfds
from versions import other_version
from weightd_client.engine_names import NoRule
from weightd_client.write_version import WriteRefused, WriteTarget, rank_sockets, serving_fingerprint, write_version

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="writers are built on the host backend")
torch = pytest.importorskip("torch")

NAME = "trainer"
Q = "model.layers.1.self_attn.q_proj.weight"
NORM = "model.layers.1.input_layernorm.weight"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = str(tmp_path_factory.mktemp("trainer") / NAME)
    other_version(MODEL, model)
    return model


@pytest.fixture(scope="module")
def served(checkpoint, tmp_path_factory):
    """The model in segments of about 1 MiB (a plan file's segmentBytes), so a partial write
    copies only some; earlier versions retained (the default --keep-versions)."""
    plan = tmp_path_factory.mktemp("plan") / "plan.json"
    plan.write_text(json.dumps({"rules": [], "segmentBytes": 1 << 20}))
    with Daemon(checkpoint, ["--plan-file", str(plan)]) as d:
        yield d


def versions(daemon):
    """ctl list's versions of the model that serve: (number, current)."""
    return sorted((m["version"], m["current"]) for m in json.loads(ctl(daemon, "list", "--json"))["models"] if m["name"] == NAME and m["state"] == "serving")


def current(daemon):
    (number,) = [v for v, now in versions(daemon) if now]
    return number


def tensors_of(daemon, version, names):
    """Copies of version ``version``'s tensors ``names``, as rank 0 serves them."""
    with daemon.client(0) as client:
        out = client.copy(serving_fingerprint(client, NAME, version), tensor_format="torch")
    return {n: out[n] for n in names}


def assert_nothing_left(daemon, before):
    assert versions(daemon) == before, "nothing may be committed"
    # The daemon closes an abandoned update's copies when its connection's end reaches it.
    assert wait_for(lambda: update_memfds(daemon.proc.pid, writable=True) == []), update_memfds(daemon.proc.pid, writable=True)


def test_the_named_tensors_become_a_version_and_the_base_keeps_its_bytes(served):
    daemon = served
    base = current(daemon)
    old = tensors_of(daemon, base, [Q, NORM])
    copies_before = len(update_memfds(daemon.proc.pid))
    with daemon.client(0) as client:
        with client.attach(serving_fingerprint(client, NAME, base), tensor_format="torch") as att:
            segments = len(att.state["segments"])
    assert segments > 2, "the plan must cut the model into segments for a partial write to share some"

    info = write_version([(Q, old[Q] + 1)], WriteTarget(NAME, socket_dir=daemon.socket_dir))

    assert info == {"model": NAME, "version": base + 1}
    assert current(daemon) == base + 1
    new = tensors_of(daemon, base + 1, [Q, NORM])
    assert torch.equal(new[Q], old[Q] + 1)
    assert torch.equal(new[NORM], old[NORM])
    again = tensors_of(daemon, base, [Q, NORM])
    assert torch.equal(again[Q], old[Q]) and torch.equal(again[NORM], old[NORM]), "the version written over keeps its bytes"
    # The written version's own segments: those holding the one tensor named (one, or two where it spans a boundary).
    copied = len(update_memfds(daemon.proc.pid)) - copies_before
    assert 1 <= copied <= 2 < segments, (copied, segments)


def test_a_name_the_daemon_does_not_hold_is_refused_naming_it(served):
    daemon = served
    before = versions(daemon)
    good = tensors_of(daemon, current(daemon), [Q])[Q]
    # vLLM's fused name, which this daemon (no --layouts vllm) has no view of to split it by.
    with pytest.raises(NoRule, match="tensor 'model.layers.1.self_attn.qkv_proj.weight' is no checkpoint tensor of model 'trainer', and the daemon serves no vllm layout") as err:
        write_version([(Q, good + 1), ("model.layers.1.self_attn.qkv_proj.weight", good)], WriteTarget(NAME, socket_dir=daemon.socket_dir))
    assert err.value.code == "E_UNKNOWN_TENSOR"
    assert_nothing_left(daemon, before)


def test_another_dtype_is_refused_before_a_byte_is_written(served):
    daemon = served
    before = versions(daemon)
    good = tensors_of(daemon, current(daemon), [Q])[Q]
    with pytest.raises(WriteRefused, match=rf"tensor '{Q}': the trainer's is torch.float32 \[256, 256\], but .* holds torch.bfloat16 \[256, 256\] .* convert it first") as err:
        write_version([(NORM, torch.ones(256, dtype=torch.bfloat16)), (Q, good.float())], WriteTarget(NAME, socket_dir=daemon.socket_dir))
    assert err.value.code == "E_TENSOR_MISMATCH"
    assert_nothing_left(daemon, before)


def test_a_failure_mid_way_commits_nothing(served):
    daemon = served
    before = versions(daemon)
    good = tensors_of(daemon, current(daemon), [Q])[Q]
    names = [(NORM, torch.bfloat16, (256,)), (Q, torch.bfloat16, (256, 256))]

    def trainer():
        yield NORM, torch.zeros(256, dtype=torch.bfloat16)
        raise RuntimeError("the trainer's gather failed")
        yield Q, good  # noqa: unreachable - the metadata promised it

    with pytest.raises(RuntimeError, match="gather failed"):
        write_version(trainer(), WriteTarget(NAME, socket_dir=daemon.socket_dir), names)
    assert_nothing_left(daemon, before)


def test_tp2_a_replicated_tensor_is_written_to_every_rank_a_shape_neither_whole_nor_a_piece_is_refused(checkpoint):
    with Daemon(checkpoint, tp=2) as daemon:
        clients = [daemon.client(r) for r in range(2)]
        try:
            wrong = torch.zeros(100, 256, dtype=torch.bfloat16)
            with pytest.raises(WriteRefused, match=rf"tensor '{Q}': the trainer's is torch.bfloat16 \[100, 256\], but the rank at .* holds torch.bfloat16 \[128, 256\] .* give the whole tensor \(\[256, 256\]\), which each of the 2 ranks' pieces is cut from"):
                write_version([(Q, wrong)], WriteTarget(NAME, socket_dir=daemon.socket_dir))
            # One rank's piece would go to both ranks, whose pieces differ.
            piece = torch.zeros(128, 256, dtype=torch.bfloat16)
            with pytest.raises(WriteRefused, match=rf"tensor '{Q}': the trainer's is torch.bfloat16 \[128, 256\], .* \(a piece would be written to every rank, and theirs differ\)"):
                write_version([(Q, piece)], WriteTarget(NAME, socket_dir=daemon.socket_dir))
            assert versions(daemon) == [(0, True)]

            norm = torch.full((256,), 0.5, dtype=torch.bfloat16)
            assert write_version([(NORM, norm)], WriteTarget(NAME, socket_dir=daemon.socket_dir)) == {"model": NAME, "version": 1}
            for rank, client in enumerate(clients):
                att = client.attach(serving_fingerprint(client, NAME, 1), tensor_format="torch")
                assert torch.equal(att.tensors[NORM], norm), f"rank {rank}"
                att.detach()
        finally:
            for c in clients:
                c.close()


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("tp", [2, 8])
def test_whole_tensors_at_tp_n_give_each_rank_the_piece_a_checkpoint_load_gives_it(checkpoint, tp):
    """A trainer holds whole tensors. Written by their checkpoint names at tp 2 (column, row and
    vocabulary splits) and tp 8 (beyond the model's 4 KV heads: each head on two ranks), each
    rank gets its piece, cut by the regions its begin_update names: the version's every rank holds,
    byte for byte, what a daemon that loads those tensors' checkpoint at the same tp holds."""
    from safetensors.torch import load_file

    whole = {}
    for f in sorted(os.listdir(MODEL)):
        if f.endswith(".safetensors"):
            whole.update(load_file(os.path.join(MODEL, f)))
    with Daemon(MODEL, tp=tp) as reference:
        expected = []
        for rank in range(tp):
            with reference.client(rank) as client:
                expected.append(client.copy(serving_fingerprint(client, os.path.basename(MODEL)), tensor_format="torch"))
    assert any(list(expected[0][n].shape) != list(t.shape) for n, t in whole.items()), "the ranks must hold pieces"
    with Daemon(checkpoint, tp=tp) as daemon:
        assert write_version(list(whole.items()), WriteTarget(NAME, socket_dir=daemon.socket_dir)) == {"model": NAME, "version": 1}
        for rank in range(tp):
            with daemon.client(rank) as client:
                got = client.copy(serving_fingerprint(client, NAME, 1), tensor_format="torch")
            assert sorted(got) == sorted(expected[rank])
            assert [n for n in got if not torch.equal(_bytes(got[n]), _bytes(expected[rank][n]))] == [], f"rank {rank}"


def test_the_rank_sockets_are_those_the_node_lists_and_no_other_socket_is_spoken_to(served):
    """The socket dir holds other sockets (the keeper's, the control socket): a writer that
    connected to each would send them requests they do not speak (the keeper logs E_BAD_MAGIC)."""
    daemon = served
    stray = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = os.path.join(daemon.socket_dir, "keeper.sock")
    stray.bind(path)
    stray.listen(4)
    stray.setblocking(False)
    try:
        got = rank_sockets(WriteTarget(NAME, socket_dir=daemon.socket_dir))
        assert got == [daemon.client(0).socket_path]
        with pytest.raises(BlockingIOError):
            stray.accept()  # nobody connected
        with pytest.raises(WriteRefused, match=r"serves no model 'nobody' \(it serves: trainer\)"):
            rank_sockets(WriteTarget("nobody", socket_dir=daemon.socket_dir))
    finally:
        stray.close()
        os.unlink(path)


def test_trainer_args_are_checked_naming_what_is_wrong():
    with pytest.raises(ValueError, match=r"\['model', 'socket'\]: .*the keys are model, socket_dir, sockets, base"):
        WriteTarget.of({"model": NAME, "socket": "/run/weightd"})
    with pytest.raises(ValueError, match="need 'model'"):
        WriteTarget.of({"model": "", "socket_dir": "/run/weightd"})
    with pytest.raises(ValueError, match="not both"):
        WriteTarget(NAME, socket_dir="/run/weightd", sockets=["/run/weightd/a.sock"])
    with pytest.raises(ValueError, match="'sockets' is empty"):
        WriteTarget(NAME, sockets=[])
