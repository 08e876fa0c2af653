"""The host backend over a real daemon: get_state names each segment "fd", get_segment_fds sends
sealed memfds on the same socket, the client maps the same bytes the checkpoint holds, closes
every descriptor it received (also when mapping fails), and /dev/shm holds no weightd file while
the daemon serves."""

import fcntl
import json
import os
import struct

import pytest

from daemon_fixture import DEVICE, REPO, Daemon
from weightd_client import expected_fingerprint
from weightd_client.host import HostMapping, SERVED_SEALS
from weightd_client.protocol import ServeError

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="memfd segments are the host backend's")
MODEL = str(REPO / "examples" / "tiny-llama")


def open_fds():
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own descriptor
    return out


def daemon_holds(pid, prefix):
    """What the daemon has open or mapped under ``prefix``."""
    held = {t for t in (os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")) if t.startswith(prefix)}
    with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
        held |= {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith(prefix)}
    return held


@pytest.fixture(scope="module")
def daemon():
    with Daemon(MODEL) as d:
        yield d


@pytest.fixture
def expected():
    e = expected_fingerprint(MODEL, 1, 0)
    return e.fingerprint, e.fields


def test_segments_are_sealed_memfds_and_dev_shm_holds_nothing_of_the_daemon(daemon, expected):
    pid = daemon.proc.pid
    assert daemon_holds(pid, "/dev/shm/") == set(), f"/dev/shm: {sorted(os.listdir('/dev/shm'))}"
    assert [t for t in daemon_holds(pid, "/memfd:weightd:") if "(deleted)" in t], "the daemon serves memfds"
    with daemon.client() as client:
        state = client.get_state(expected[0], "map", expected[1])
        assert [s["handle"] for s in state["segments"]] == ["fd"] * len(state["segments"])
        fds = client.segment_fds(state["leaseId"])
        try:
            assert sorted(fds) == [s["segment"] for s in state["segments"]]
            for seg in state["segments"]:
                fd = fds[seg["segment"]]
                assert fcntl.fcntl(fd, 1034) & SERVED_SEALS == SERVED_SEALS
                assert os.fstat(fd).st_size == seg["bytes"]
                assert os.get_inheritable(fd) is False, "received with MSG_CMSG_CLOEXEC"
                with pytest.raises(PermissionError):
                    os.pwrite(fd, b"x", 0)
        finally:
            for fd in fds.values():
                os.close(fd)
        client.detach(state["leaseId"])


def checkpoint_tensors(model=MODEL):
    """Every tensor's bytes as the safetensors files hold them (tp=1: the rank holds them whole)."""
    out = {}
    for name in sorted(os.listdir(model)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model, name), "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        for tensor, meta in json.loads(data[8 : 8 + n]).items():
            if tensor != "__metadata__":
                begin, end = meta["data_offsets"]
                out[tensor] = data[8 + n + begin : 8 + n + end]
    return out


def test_attach_maps_the_checkpoint_bytes_and_leaves_no_descriptor(daemon, expected):
    want = checkpoint_tensors()
    with daemon.client() as client:
        client.ping()  # the connection is open before the count
        before = open_fds()
        attached = client.attach(expected[0], expected[1], tensor_format="memoryview")
        got = {name: bytes(t) for name, t in attached.tensors.items() if name in want}
        assert got.keys() == want.keys()
        assert all(got[n] == want[n] for n in want), [n for n in want if got[n] != want[n]]
        held = [t for t in open_fds().values() if t.startswith("/memfd:weightd:")]
        # CPython's mmap keeps a dup of each mapped descriptor until it closes (before 3.13).
        assert len(held) <= len(attached.state["segments"])
        del got
        attached.detach()
        assert open_fds() == before, "every received descriptor is closed after detach"


def test_a_segment_that_fails_its_checks_is_refused_and_every_received_fd_closed(daemon, expected):
    with daemon.client() as client:
        state = client.get_state(expected[0], "map", expected[1])
        try:
            fds = client.segment_fds(state["leaseId"])
            unsealed = os.memfd_create("not-weightd", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(unsealed, state["segments"][0]["bytes"])
            two = {**fds, 99: unsealed}
            forged = {**state, "segments": state["segments"] + [{"segment": 99, "bytes": 4096, "handle": "fd"}]}
            with pytest.raises(ServeError) as refused:
                HostMapping(forged, two)
            assert refused.value.code == "E_SHM_OPEN"
            assert "segment 99's descriptor is not sealed against write, shrink and grow" in str(refused.value)
            for fd in [*fds.values(), unsealed]:
                with pytest.raises(OSError):
                    os.fstat(fd)

            fds = client.segment_fds(state["leaseId"])
            short = {**state, "segments": [{**state["segments"][0], "bytes": state["segments"][0]["bytes"] + 4096}]}
            with pytest.raises(ServeError, match="fewer than its"):
                HostMapping(short, fds)
            assert all(not os.path.exists(f"/proc/self/fd/{fd}") or not os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:weightd:") for fd in fds.values())
        finally:
            client.detach(state["leaseId"])


def test_get_segment_fds_needs_a_live_lease(daemon, expected):
    with daemon.client() as client:
        state = client.get_state(expected[0], "map", expected[1])
        client.detach(state["leaseId"])
        before = open_fds()
        with pytest.raises(ServeError) as refused:
            client.segment_fds(state["leaseId"])
        assert refused.value.code == "E_NO_LEASE"
        assert open_fds() == before
