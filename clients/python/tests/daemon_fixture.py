"""Runs the weightd daemon (node dist/main.js of this checkout) for a Python test.

``WEIGHTD_TEST_DEVICE=cuda`` serves GPU 0 instead of the host backend (the GPU suite). Each
daemon gets its own socket dir and host device id; ``stop()`` ends it with SIGTERM (the
daemon removes its socket and frees its segments) and removes the dir, on every path.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[3]
MAIN_JS = REPO / "dist" / "main.js"
READY = '"ready":true'
DEVICE = os.environ.get("WEIGHTD_TEST_DEVICE", "host")

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    # A pytest killed on a timeout runs no finalizer: the kernel's SIGTERM on its death lets the
    # daemon remove its socket and segments instead of serving on with nobody to stop it. Only
    # a libc call, so it is safe in the child between fork and exec.
    if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        os._exit(127)


class Daemon:
    """``node dist/main.js`` on ``model``, ready when its READY line (a JSON log line off a terminal,
    written at any --log-level) has been read; ``RuntimeError`` with its log if it exits first or
    is not ready within ``ready_timeout`` seconds.

    ``tp`` ranks on ``device`` (host: one host device id per rank, ``host_device-<rank>``);
    ``socket_dir`` defaults to a fresh directory that ``stop()`` removes."""

    def __init__(
        self,
        model: str,
        extra_args: Optional[List[str]] = None,
        ready_timeout: float = 120.0,
        *,
        tp: int = 1,
        device: str = DEVICE,
        socket_dir: Optional[str] = None,
        host_device: Optional[str] = None,
    ):
        if not MAIN_JS.exists():
            raise RuntimeError(f"{MAIN_JS} is missing: run npm run build:ts first")
        self._owns_dir = socket_dir is None
        self.socket_dir = socket_dir if socket_dir is not None else tempfile.mkdtemp(prefix="weightd-pytest-")
        base = host_device or f"py{os.getpid()}-{os.path.basename(self.socket_dir)}"
        self.device = base if tp == 1 else ",".join(f"{base}-{r}" for r in range(tp))
        self.stderr_lines: List[str] = []
        env = {**os.environ, "WEIGHTD_HOST_DEVICES": self.device}
        args = ["node", str(MAIN_JS), "--model", str(model), "-tp", str(tp), "--device", device, "--weight-cache-socket-dir", str(self.socket_dir), *(extra_args or [])]
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_end_with_parent)
        ready, seen = threading.Event(), []

        def pump() -> None:
            # Reads stderr to its end, so a full pipe never stalls the daemon's logging.
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.stderr_lines.append(line)
                if READY in line:
                    seen.append(True)
                    ready.set()
            ready.set()  # stderr ended (the daemon is exiting): not ready, whether or not it has been reaped yet

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        try:
            if not ready.wait(ready_timeout) or not seen or self.proc.poll() is not None:
                raise RuntimeError(f"weightd did not become ready (exit {self.proc.poll()}):\n{''.join(self.stderr_lines)}")
        except BaseException:
            self.stop()
            raise

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def client(self, global_rank: int = 0):
        from weightd_client.client import WeightdClient, find_socket

        return WeightdClient(find_socket(global_rank=global_rank, socket_dir=str(self.socket_dir)))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._pump.join(5)
        if self._owns_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def counting_fds(client):
    """The descriptors each of ``client``'s get_segment_fds replies brought, in order, from now on."""
    received = []
    request_fds = client.conn.request_fds

    def counting(cmd, **body):
        reply, fds = request_fds(cmd, **body)
        received.append(len(fds))
        return reply, fds

    client.conn.request_fds = counting
    return received
