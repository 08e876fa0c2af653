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
