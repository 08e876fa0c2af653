"""The client's retirer (weightd_client/retire.py): what a switch lets go of runs on one thread,
in the order given, after the caller returned; settle waits for it; a failure is logged and the
thread goes on; a forked child starts a thread of its own."""

import logging
import os
import select
import signal
import threading

from weightd_client.retire import Retirer


def test_jobs_run_in_order_off_the_callers_thread_and_settle_waits_for_them():
    r = Retirer()
    gate, ran = threading.Event(), []
    r.submit(lambda: (gate.wait(30), ran.append(("first", threading.current_thread().name))))
    r.submit(lambda: ran.append(("second", threading.current_thread().name)))
    assert ran == [], "submit returns before the jobs run"
    gate.set()
    r.settle()
    assert [what for what, _ in ran] == ["first", "second"]
    assert {thread for _, thread in ran} == {"weightd-retire"}


def test_a_failing_job_is_logged_and_the_next_one_runs(caplog):
    r = Retirer()
    ran = []

    def fail() -> None:
        raise RuntimeError("no such allocation")

    with caplog.at_level(logging.WARNING, logger="weightd_client"):
        r.submit(fail)
        r.submit(lambda: ran.append(1))
        r.settle()
    assert ran == [1]
    assert any("no such allocation" in rec.getMessage() for rec in caplog.records)


def test_settle_on_the_retirers_own_thread_returns_at_once():
    r = Retirer()
    done = []
    r.submit(lambda: (r.settle(), done.append(1)))
    r.settle()
    assert done == [1], "a job that settles (a finalizer run there) does not wait for itself"


def test_a_forked_child_runs_its_jobs_on_a_thread_of_its_own():
    r = Retirer()
    r.submit(lambda: None)
    r.settle()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is not here
        try:
            os.close(read)
            r.submit(lambda: os.write(write, b"ran"))
            r.settle()
        finally:
            os._exit(0)
    os.close(write)
    # A child that waited on the parent's queue, whose thread it does not have, would wait forever.
    ready, _, _ = select.select([read], [], [], 30)
    got = os.read(read, 16) if ready else b""
    os.close(read)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert got == b"ran", "the child's job ran on a thread of the child's own"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
