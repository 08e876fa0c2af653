"""Runs the weightd daemon (node dist/main.js of this checkout) for a Python test.

``WEIGHTD_TEST_DEVICE=cuda`` serves GPU 0 instead of the host backend (the GPU suite). Each
daemon gets its own socket dir and host device id; ``stop()`` ends it with SIGTERM (the
daemon removes its socket and shared-memory segments) and removes the dir, on every path.
"""

from __future__ import annotations

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
READY = '"msg":"READY node '
DEVICE = os.environ.get("WEIGHTD_TEST_DEVICE", "host")


class Daemon:
    def __init__(self, model: str, extra_args: Optional[List[str]] = None, ready_timeout: float = 60.0):
        if not MAIN_JS.exists():
            raise RuntimeError(f"{MAIN_JS} is missing: run npm run build:ts first")
        self.socket_dir = tempfile.mkdtemp(prefix="weightd-pytest-")
        self.device = f"py{os.getpid()}-{os.path.basename(self.socket_dir)}"
        self.stderr_lines: List[str] = []
        env = {**os.environ, "WEIGHTD_HOST_DEVICES": self.device}
        args = ["node", str(MAIN_JS), "--model", model, "-tp", "1", "--device", DEVICE, "--weight-cache-socket-dir", self.socket_dir, *(extra_args or [])]
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.stderr_lines.append(line)
                if READY in line:
                    ready.set()
            ready.set()  # exited: the waiter checks which

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        try:
            if not ready.wait(ready_timeout) or self.proc.poll() is not None:
                raise RuntimeError(f"weightd did not become ready (exit {self.proc.poll()}):\n{''.join(self.stderr_lines)}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._pump.join(5)
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
