"""find_socket trusts node.json only while the daemon it names runs: same pid AND same start
time (docs/spec/liveness.md). A file whose pid was reused by another process is ignored."""

import json
import os

import pytest

from weightd_client.client import find_socket
from weightd_client.liveness import start_time_of


def manifest_dir(tmp_path, start_time):
    sock = tmp_path / "GPU-0.sock"
    sock.write_bytes(b"")
    ranks = [{"globalRank": 0, "localRank": 0, "socketPath": str(sock), "deviceUuid": "GPU-0", "fingerprint": "f" * 64}]
    (tmp_path / "node.json").write_text(json.dumps({"version": 1, "pid": os.getpid(), "startTime": start_time, "writtenAt": "x", "ranks": ranks}))
    return str(tmp_path), str(sock)


def test_live_daemon_manifest_is_used(tmp_path):
    d, sock = manifest_dir(tmp_path, start_time_of(os.getpid()))
    assert find_socket(global_rank=0, socket_dir=d) == sock


def test_reused_pid_manifest_is_ignored(tmp_path):
    d, _ = manifest_dir(tmp_path, (start_time_of(os.getpid()) or "") + "1")
    with pytest.raises(Exception, match="rank 0"):
        find_socket(global_rank=0, socket_dir=d)


def test_search_skips_the_keeper_and_control_sockets(tmp_path):
    """With no node.json, only sockets that may serve a rank are asked (docs/spec/socket-names.md):
    the keeper logs a stranger's ping as E_BAD_MAGIC, a control socket speaks another protocol."""
    import socket

    listeners, asked = [], []
    for name in ("keeper.sock", "control-4242.sock", "host-0.sock"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(tmp_path / name))
        s.listen(4)
        s.setblocking(False)
        listeners.append((name, s))
    try:
        # host-0 accepts and never answers: find_socket gives up on it after its 2 s timeout.
        with pytest.raises(Exception, match="rank 0"):
            find_socket(global_rank=0, socket_dir=str(tmp_path))
        for name, s in listeners:
            try:
                s.accept()[0].close()
                asked.append(name)
            except BlockingIOError:
                pass
    finally:
        for _, s in listeners:
            s.close()
    assert asked == ["host-0.sock"]
