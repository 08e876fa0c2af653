"""The test daemon ends with the test process that started it, even one killed with SIGKILL
(as a runner's timeout does): no daemon keeps serving, and its socket goes with it."""

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from weightd_client.liveness import is_process_alive

from daemon_fixture import REPO

STARTER = """
import os, sys
sys.path.insert(0, sys.argv[1])
from daemon_fixture import Daemon
d = Daemon(sys.argv[2])
print(d.proc.pid, d.socket_dir, flush=True)
sys.stdin.read()
"""


def running(pid: int) -> bool:
    # The orphaned daemon is reaped by init, not by us: a zombie has ended as well.
    if not is_process_alive(pid):
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_test_process_takes_its_daemon_down():
    tests = str(Path(__file__).resolve().parent)
    starter = subprocess.Popen([sys.executable, "-c", STARTER, tests, str(REPO / "examples" / "tiny-llama")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid_text, socket_dir = starter.stdout.readline().split()
        daemon_pid = int(pid_text)
        assert glob.glob(os.path.join(socket_dir, "*.sock")), "the daemon serves before its starter dies"
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    # The daemon's own SIGTERM handling removes its socket and exits; give a loaded machine time.
    deadline = time.monotonic() + 60
    while running(daemon_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(daemon_pid), f"daemon {daemon_pid} outlived the test process that started it"
    assert not glob.glob(os.path.join(socket_dir, "*.sock"))
    os.rmdir(socket_dir)
