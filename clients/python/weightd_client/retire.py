"""What a switch lets go of, let go of after it returns (issue 31).

A switch's stall is the engine's: between two steps, nothing computes until ``switch_to``
returns. Once the new version is mapped, the old one is only given back: its imported
allocations are released and its lease is dropped. On an H100 those took 1.2-1.5 ms of a
prepared 5.9-6.2 ms switch (83 segments, 8.24 GB), past the remap itself; run here, the switch
took 4.7 ms (bench/RESULTS.md, 2026-12-07 06:55). They need not delay the next step, so they run
on one thread per client, in the order asked, right after.

What the client itself does next sees them done: each request on its connection waits for them
first (``settle``), so a ``stats`` or ``detach`` after a switch never finds the old lease still
held. Another process may see the old lease for the milliseconds the thread takes; the daemon
keeps a version while any lease holds it, so that only delays a free. A process that exits
with work queued loses nothing: its leases end with it, and so do its imports.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Callable, Optional

log = logging.getLogger("weightd_client")


#: What a mapping's ``finish_remap`` takes to let go of what it replaced: a Retirer's ``submit``, or run_now.
Retire = Callable[[Callable[[], None]], None]


def run_now(job: Callable[[], None]) -> None:
    """A ``retire`` that runs the job at once, on the caller's thread (no Retirer given)."""
    job()


class Retirer:
    """One daemon thread that runs the jobs given to it, in order, and logs their failures (a
    job's caller has returned: there is no one to raise to)."""

    def __init__(self, name: str = "weightd-retire") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._queue: "Optional[queue.Queue[Callable[[], None]]]" = None
        self._thread: Optional[threading.Thread] = None
        self._pid = 0

    def submit(self, job: Callable[[], None]) -> None:
        """Runs ``job`` on the thread, after every job given before it."""
        self._started().put(job)

    def settle(self) -> None:
        """Waits until every job given so far has run. On the thread itself (a job's garbage
        collection ran a finalizer that asks for it) it returns at once: waiting there would
        wait for itself."""
        with self._lock:
            work = self._queue if self._pid == os.getpid() else None
        if work is None or threading.current_thread() is self._thread:
            return
        work.join()

    def _started(self) -> "queue.Queue[Callable[[], None]]":
        with self._lock:
            # A forked child has the queue but not the thread: it starts its own.
            if self._queue is None or self._pid != os.getpid():
                self._queue, self._pid = queue.Queue(), os.getpid()
                self._thread = threading.Thread(target=self._run, args=(self._queue,), name=self._name, daemon=True)
                self._thread.start()
            return self._queue

    @staticmethod
    def _run(work: "queue.Queue[Callable[[], None]]") -> None:
        while True:
            job = work.get()
            try:
                job()
            except BaseException as err:  # noqa: BLE001 - logged: its caller has returned
                log.warning("weightd: letting go of what a switch replaced failed: %s", err)
            finally:
                work.task_done()
