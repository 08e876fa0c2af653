"""A written version is restored at a restart only beside the checkpoint it was written over
(issue 31; docs/spec/kept-written.md): its kept digests are in that checkpoint's manifest order
and its fields are that checkpoint's, so a start that plans other tensors (two names swapped in a
header, nothing moved) or names another checkpoint directory of the same name and layout refuses
it, with a warn line naming what changed, and drops its kept shards; version 0 of the checkpoint
the command line names serves as current. A record of written format 1 (an earlier weightd's,
with no manifest) is refused by its format alike, never trusted."""

import json
import os
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from daemon_fixture import DEVICE, MAIN_JS, REPO, Daemon
from test_host_fds import MODEL
from test_update_keeper import fingerprint, kept, read_all, versions
from test_switch import wait_for
from versions import other_version

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="writers are built on the host backend")

NAME = "kv"
Q_PROJ = b"model.layers.0.self_attn.q_proj.weight"
O_PROJ = b"model.layers.0.self_attn.o_proj.weight"


@pytest.fixture
def node():
    """``start(model_dir)``: a daemon with --keeper spawn on ``model_dir`` (named ``kv`` by its
    directory), the same socket directory and host device each time; and the first checkpoint's
    directory. The keeper is stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="weightd-keepid-") as tmp:
        tmp = Path(tmp)
        model = str(tmp / "a" / NAME)
        other_version(MODEL, model, 0)
        socket_dir = str(tmp / "sockets")
        os.mkdir(socket_dir, 0o700)
        started = []

        def start(model_dir):
            d = Daemon(model_dir, ["--keeper", "spawn"], socket_dir=socket_dir, host_device=f"kvid{os.getpid()}")
            started.append(d)
            return d

        yield start, model
        for d in started:
            d.stop()
        subprocess.run(["node", str(MAIN_JS), "keeper", "stop", "--weight-cache-socket-dir", socket_dir], capture_output=True, timeout=60)


def write_version_1(daemon):
    """Version 1 over version 0: q_proj's bytes each plus one. Returns (version 0's, version 1's) tensors."""
    with daemon.client(0) as client:
        base = fingerprint(client, 0)
        v0 = read_all(client, base)
        q = Q_PROJ.decode()
        with client.begin_update(NAME, base, tensors=[q]) as upd:
            upd.write(q, bytes((b + 1) % 256 for b in v0[q]))
            assert upd.commit()["version"] == 1
        v1 = read_all(client, fingerprint(client, 1))
    assert wait_for(lambda: sorted(s["version"] for s in kept(daemon)) == [0, 1])
    return v0, v1


def refusals(daemon):
    return [json.loads(line)["msg"] for line in daemon.stderr_lines if '"refused kept written version' in line]


def test_a_header_whose_names_were_swapped_refuses_the_written_version(node):
    start, model = node
    daemon = start(model)
    v0, _ = write_version_1(daemon)
    daemon.stop()
    # q_proj and o_proj exchange names: same shape, dtype and name length, so no byte moves and the
    # arena is laid out as before; the version's q_proj bytes would serve as o_proj.
    path = os.path.join(model, "model-00001-of-00002.safetensors")
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = f.read(n)
        swapped = header.replace(Q_PROJ, b"\0").replace(O_PROJ, Q_PROJ).replace(b"\0", O_PROJ)
        assert swapped != header and len(swapped) == n
        f.seek(8)
        f.write(swapped)

    daemon = start(model)
    assert versions(daemon) == {0: True}, "version 1 is not served under the new names"
    assert any('version 1 of model "kv"' in m and "fingerprint's headers" in m for m in refusals(daemon)), refusals(daemon)
    assert wait_for(lambda: sorted(s["version"] for s in kept(daemon)) == [0]), kept(daemon)
    with daemon.client(0) as client:
        now = read_all(client, fingerprint(client, 0))
    q, o = Q_PROJ.decode(), O_PROJ.decode()
    assert now[q] == v0[o] and now[o] == v0[q], "version 0 is the files' tensors under their names now"


def test_another_checkpoint_directory_of_the_same_name_and_layout_refuses_the_written_version(node):
    start, model = node
    daemon = start(model)
    v0, _ = write_version_1(daemon)
    daemon.stop()
    other = os.path.join(os.path.dirname(os.path.dirname(model)), "b", NAME)
    other_version(model, other, 0x5A)

    daemon = start(other)
    assert versions(daemon) == {0: True}, "the checkpoint the command line names is current, with no version written over another"
    assert any(f"written over the checkpoint in {model}" in m and f"from {other}" in m for m in refusals(daemon)), refusals(daemon)
    assert wait_for(lambda: sorted(s["version"] for s in kept(daemon)) == [0]), kept(daemon)
    with daemon.client(0) as client:
        now = read_all(client, fingerprint(client, 0))
    assert all(now[n] == bytes(b ^ 0x5A for b in v0[n]) for n in v0), "version 0 is the other directory's bytes"


def test_a_record_of_written_format_1_is_refused_by_its_format_and_dropped(node):
    start, model = node
    daemon = start(model)
    write_version_1(daemon)
    daemon.stop()
    # As an earlier weightd kept it: written format 1, no manifest; the same descriptors.
    (v1,) = [s for s in kept(daemon) if s["version"] == 1]
    rewrite = REPO / "dist" / "test" / "keeper" / "fixtures" / "rewriteKeptRecord.js"
    socket = os.path.join(daemon.socket_dir, "keeper.sock")
    r = subprocess.run(["node", str(rewrite), socket, v1["device"], v1["fingerprint"], "written-format-1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [s["version"] for s in kept(daemon) if s["fingerprint"] == v1["fingerprint"]] == [None], "the record is one this weightd does not read"

    daemon = start(model)
    assert versions(daemon) == {0: True}
    refused = [json.loads(line)["msg"] for line in daemon.stderr_lines if v1["fingerprint"] in line and '"level":40' in line]
    assert any('written version 1 of model "kv" is in written format 1, and this weightd reads written formats 2' in m for m in refused), daemon.stderr
    assert wait_for(lambda: sorted(s["version"] for s in kept(daemon)) == [0]), kept(daemon)


def test_a_link_repointed_to_another_checkout_refuses_the_written_version(node):
    """The directory is compared with every symbolic link followed (docs/spec/kept-written.md §3.1):
    the record names the checkout the link led to at the commit, and the link now leads elsewhere."""
    start, model = node
    top = os.path.dirname(os.path.dirname(model))
    link = os.path.join(top, "current")
    os.symlink(os.path.join(top, "a"), link)
    daemon = start(os.path.join(link, NAME))
    v0, _ = write_version_1(daemon)
    assert [s["model"] for s in kept(daemon) if s["version"] == 1] == [os.path.realpath(model)], "the record names the directory itself"
    daemon.stop()
    other = os.path.join(top, "b", NAME)
    other_version(model, other, 0x5A)
    os.remove(link)
    os.symlink(os.path.join(top, "b"), link)

    daemon = start(os.path.join(link, NAME))
    assert versions(daemon) == {0: True}, "the checkout the link leads to now is current, with no version written over another"
    assert any(f"written over the checkpoint in {os.path.realpath(model)}" in m and f"({os.path.realpath(other)}, its symbolic links followed)" in m for m in refusals(daemon)), refusals(daemon)
    assert wait_for(lambda: sorted(s["version"] for s in kept(daemon)) == [0]), kept(daemon)
    with daemon.client(0) as client:
        now = read_all(client, fingerprint(client, 0))
    assert all(now[n] == bytes(b ^ 0x5A for b in v0[n]) for n in v0), "version 0 is the other checkout's bytes"


def test_a_checkpoint_named_through_a_link_and_then_by_its_own_path_keeps_its_written_version(node):
    start, model = node
    top = os.path.dirname(os.path.dirname(model))
    link = os.path.join(top, "current")
    os.symlink(os.path.join(top, "a"), link)
    daemon = start(os.path.join(link, NAME))
    _, v1 = write_version_1(daemon)
    daemon.stop()

    daemon = start(model)
    assert versions(daemon) == {0: False, 1: True}, daemon.stderr
    assert not refusals(daemon)
    with daemon.client(0) as client:
        assert read_all(client, fingerprint(client, 1)) == v1
