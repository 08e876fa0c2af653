"""Processed layouts against a real daemon (host backend; docs/engines.md, "Publishing what the
engine computed"): an engine publishes what it computed beside a served version, the next one
with the same key maps exactly those bytes read-only, and one whose key differs is told which
field did; a second publish of a key is refused (map it), past the cap is E_OUT_OF_MEMORY, an
uncommitted publish leaves nothing, the version's own bytes never change, and the layout goes
with its version. The key is held to test/vectors/processed-key.json (docs/spec/processed-key.md)."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from daemon_fixture import DEVICE, Daemon
from test_host_fds import MODEL
from test_switch import ctl, wait_for
from versions import other_version
from weightd_client.processed import Absent, Processed, lookup, params_digest, processed_key, publish
from weightd_client.protocol import Connection, ServeError, close_fds

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="publishing is built on the host backend")
torch = pytest.importorskip("torch")

VECTORS = Path(__file__).resolve().parents[3] / "test" / "vectors" / "processed-key.json"
NAME = "proc"


def test_the_key_and_its_params_field_follow_the_vectors():
    for case in json.loads(VECTORS.read_text())["cases"]:
        assert params_digest([tuple(p) for p in case["params"]]) == case["fields"]["params"], case["name"]
        assert processed_key(case["fields"]) == case["key"], case["name"]
    with pytest.raises(ValueError, match="missing \\['arch'\\]"):
        processed_key({k: v for k, v in json.loads(VECTORS.read_text())["cases"][0]["fields"].items() if k != "arch"})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The own model, and a second one named ``proc`` (a model actor) to publish beside and unload."""
    model = str(tmp_path_factory.mktemp("processed") / NAME)
    other_version(MODEL, model)
    with Daemon(MODEL, ["--model", model, "-tp", "1"]) as d:
        yield d


def base_of(daemon, name):
    return next(v["fingerprint"] for v in daemon.client(0).ping()["models"] if v["name"] == name and v["status"] == "serving")


def fields(base, **over):
    f = {"protocol": "processed-1", "base": base, "engine": "test", "engineVersion": "1.0", "processing": "FakeMethod with FakeKernel", "arch": "cpu", "tp": "0/1", "params": "0" * 32}
    return {**f, **over}


def computed():
    """What a fake processing step computed: a transposed bf16 weight and an fp8 one with its scale."""
    g = torch.Generator().manual_seed(7)
    return {
        "layers.0.proj.weight": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "layers.0.proj.packed": (torch.randn(64, generator=g) * 10).to(torch.float8_e4m3fn),
        "layers.0.proj.scale": torch.tensor([0.5], dtype=torch.float32),
    }


def version_digest(daemon, base):
    """sha256 of every tensor of the version as a client maps it: what an engine reads."""
    client = daemon.client(0)
    att = client.attach(base, tensor_format="numpy")
    try:
        h = hashlib.sha256()
        for name in sorted(att.tensors):
            h.update(name.encode() + att.tensors[name].tobytes())
        return h.hexdigest()
    finally:
        att.detach()
        client.close()


def processed_fds(pid):
    """The daemon's descriptors of processed layouts (publishDesk.ts names their memfds)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:weightd:processed:"):
                out.append(fd)
        except OSError:
            continue
    return out


def test_published_parameters_map_read_only_with_their_bytes_and_the_version_is_unchanged(served):
    daemon = served
    base = base_of(daemon, NAME)
    before = version_digest(daemon, base)
    sock = daemon.client(0).socket_path
    mine = fields(base)
    key = processed_key(mine)
    assert isinstance(lookup(sock, base, key), Absent)
    done = publish(sock, NAME, base, mine, computed())
    assert done["key"] == key and done["bytes"] >= sum(t.numel() * t.element_size() for t in computed().values())
    got = lookup(sock, base, key)
    assert isinstance(got, Processed)
    for name, want in computed().items():
        assert got.tensors[name].dtype == want.dtype and got.tensors[name].shape == want.shape
        assert torch.equal(got.tensors[name].view(torch.uint8), want.view(torch.uint8)), name
    # Read-only: the daemon's sealed memory, mapped PROT_READ.
    assert got.mapping.read_only
    leases = [l for l in daemon.client(0).stats(base)["leases"] if l["pid"] == os.getpid()]
    assert [l["mode"] for l in leases] == ["map"], "the mapping holds a map lease of its version"
    del got.tensors
    got.mapping.close()
    daemon.client(0).detach(got.lease)
    assert version_digest(daemon, base) == before, "publishing beside a version changes none of its bytes"


def test_a_second_publish_of_a_key_is_refused_and_another_key_says_which_field_differs(served):
    daemon = served
    base = base_of(daemon, NAME)
    sock = daemon.client(0).socket_path
    mine = fields(base, engineVersion="2.0")
    publish(sock, NAME, base, mine, computed())
    with pytest.raises(ServeError) as again:
        publish(sock, NAME, base, mine, computed())
    assert again.value.code == "E_PUBLISHED" and "map it" in str(again.value)
    other = fields(base, engineVersion="2.0", arch="sm_90")
    absent = lookup(sock, base, processed_key(other))
    assert isinstance(absent, Absent)
    assert any(p["key"] == processed_key(mine) for p in absent.published)
    assert absent.why(other) == "the published key differs in arch (published 'cpu', this engine 'sm_90')"


def test_past_the_cap_is_out_of_memory_and_an_uncommitted_publish_leaves_nothing(served):
    daemon = served
    base = base_of(daemon, NAME)
    sock = daemon.client(0).socket_path
    # The default cap (--processed-max-percent 100): as many bytes as the version's.
    whole = sum(s["bytes"] for s in daemon.client(0).get_state(base, "copy", layout="checkpoint")["segments"])
    with pytest.raises(ServeError) as big:
        publish(sock, NAME, base, fields(base, engineVersion="big"), {"w": torch.zeros(whole + 1, dtype=torch.uint8)})
    assert big.value.code == "E_OUT_OF_MEMORY" and "--processed-max-percent" in str(big.value)
    held = processed_fds(daemon.proc.pid)
    conn = Connection(sock)
    mine = fields(base, engineVersion="abandoned")
    reply, fds = conn.request_fds("begin_publish", model=NAME, base=base, key=processed_key(mine), keyFields=mine, tensors=[{"name": "w", "dtype": "F32", "shape": [4]}])
    close_fds(fds)
    assert len(processed_fds(daemon.proc.pid)) == len(held) + 1
    conn.close()  # before commit_publish: the publish ends with its connection
    assert wait_for(lambda: len(processed_fds(daemon.proc.pid)) == len(held))
    assert isinstance(lookup(sock, base, processed_key(mine)), Absent)


def test_a_transposed_parameter_is_published_as_its_storage_and_adopted_back_once(served):
    """What vLLM's FP8 kernels leave (weight.t()) goes out as its contiguous storage, named #t,
    and comes back as the same transposed view; adopting replaces the layer's processing once."""
    from torch import nn

    from weightd_client.vllm_processed import Plan, adopt, computed, misfits

    daemon = served
    base = base_of(daemon, NAME)
    sock = daemon.client(0).socket_path
    storage = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    layer = nn.Module()
    layer.weight = nn.Parameter(storage.t(), requires_grad=False)  # [4, 3], strides (1, 4)
    layer.weight_scale = nn.Parameter(torch.tensor([2.0]), requires_grad=False)
    restored = []

    class Method:
        def process_weights_after_loading(self, layer):
            raise AssertionError("processing ran on an adopted layer")

    method = Method()
    mine = fields(base, engineVersion="transposed")
    plan = Plan({"model.layers.0.proj": (layer, method, lambda l, m: restored.append(l))}, ["model.layers.0.proj.weight"], mine)
    out = computed(plan)
    assert sorted(out) == ["model.layers.0.proj.weight#t", "model.layers.0.proj.weight_scale"]
    publish(sock, NAME, base, mine, out)

    fresh = nn.Module()
    fresh.weight = nn.Parameter(torch.empty(4, 3), requires_grad=False)
    fresh.weight_scale = nn.Parameter(torch.empty(1), requires_grad=False)
    fresh.input_scale = nn.Parameter(torch.empty(1), requires_grad=False)  # processing dropped it
    plan.layers = {"model.layers.0.proj": (fresh, method, lambda l, m: restored.append(l))}
    found = lookup(sock, base, plan.key)
    assert isinstance(found, Processed) and misfits(plan, found) == []
    assert misfits(Plan({"other": plan.layers["model.layers.0.proj"]}, [], mine), found) == [
        "layers published that this model does not process: model.layers.0.proj",
        "layers this model processes that are not published: other",
    ]
    assert adopt(plan, found) == 2
    assert torch.equal(fresh.weight, storage.t()) and fresh.weight.stride() == (1, 4)
    assert torch.equal(fresh.weight_scale, torch.tensor([2.0]))
    assert "input_scale" not in dict(fresh.named_parameters())
    method.process_weights_after_loading(fresh)
    assert restored == [fresh]
    with pytest.raises(AssertionError, match="processing ran"):
        method.process_weights_after_loading(fresh)  # once: a later reload processes again
    daemon.client(0).detach(found.lease)


def test_a_publish_still_mapped_writable_is_refused_naming_commit_publish(served):
    import mmap

    daemon = served
    base = base_of(daemon, NAME)
    conn = Connection(daemon.client(0).socket_path)
    try:
        mine = fields(base, engineVersion="mapped")
        reply, fds = conn.request_fds("begin_publish", model=NAME, base=base, key=processed_key(mine), keyFields=mine, tensors=[{"name": "w", "dtype": "F32", "shape": [4]}])
        mapped = mmap.mmap(fds[0], reply["segments"][0]["bytes"], flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        close_fds(fds)
        with pytest.raises(ServeError) as refused:
            conn.request("commit_publish", publish=reply["publish"])
        assert refused.value.code == "E_UPDATE_MAPPED"
        assert "then send commit_publish again" in str(refused.value) and "commit_update" not in str(refused.value), str(refused.value)
        mapped.close()
        assert conn.request("commit_publish", publish=reply["publish"])["key"] == processed_key(mine)
    finally:
        conn.close()


def test_a_lookup_that_fails_to_map_gives_its_lease_back(served):
    """get_processed grants a map lease, which follows the process: a mapping that fails after it
    (here a tensor format no view is made in) must not leave it pinning the version's memory."""
    daemon = served
    base = base_of(daemon, NAME)
    sock = daemon.client(0).socket_path
    mine = fields(base, engineVersion="unmappable")
    publish(sock, NAME, base, mine, computed())
    with pytest.raises(ValueError, match="bogus"):
        lookup(sock, base, processed_key(mine), tensor_format="bogus")
    assert [l for l in daemon.client(0).stats(base)["leases"] if l["pid"] == os.getpid()] == []


# Last: it unloads the model the tests above publish beside.
def test_a_published_layout_goes_with_its_version(served):
    daemon = served
    base = base_of(daemon, NAME)
    sock = daemon.client(0).socket_path
    publish(sock, NAME, base, fields(base, engineVersion="gone"), computed())
    assert processed_fds(daemon.proc.pid)
    ctl(daemon, "unload", NAME)
    assert wait_for(lambda: not processed_fds(daemon.proc.pid))
    with pytest.raises(ServeError) as unknown:
        lookup(sock, base, processed_key(fields(base, engineVersion="gone")))
    assert unknown.value.code in ("E_UNKNOWN_MODEL", "E_RELEASED", "E_DRAINING")
