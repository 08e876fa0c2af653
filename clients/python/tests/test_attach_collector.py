"""An attach pauses Python's cyclic collector and, where the process froze nothing itself, hands
what it made straight to the oldest generation (client._collector_paused says why): after it, the
collector runs again, nothing is left frozen, and every view is in the oldest generation; the
process's own young garbage is freed, not handed to the oldest generation with the views; a
process that froze objects of its own keeps them frozen."""

import gc
import weakref

import pytest

pytest.importorskip("torch")

from daemon_fixture import REPO, Daemon  # noqa: E402
from weightd_client import expected_fingerprint  # noqa: E402

MODEL = str(REPO / "examples" / "tiny-llama")


@pytest.fixture(scope="module")
def daemon():
    with Daemon(MODEL) as d:
        yield d


def in_generation(objects, generation):
    ids = {id(o) for o in gc.get_objects(generation=generation)}
    return [id(o) in ids for o in objects]


def test_the_views_of_an_attach_go_to_the_oldest_generation_and_nothing_stays_frozen(daemon):
    assert gc.isenabled() and gc.get_freeze_count() == 0
    client = daemon.client()
    with client.attach(expected_fingerprint(MODEL, 1, 0).fingerprint, tensor_format="torch") as attached:
        views = list(attached.tensors.values())
        assert gc.isenabled()
        assert gc.get_freeze_count() == 0
        assert all(in_generation(views, 2)), "every view in the oldest generation"
    client.close()


class Buffer:
    """Stands for a large buffer a cycle of garbage holds (an exception's frames, say)."""


def test_the_process_s_young_garbage_is_freed_not_moved_to_the_oldest_generation_with_the_views(daemon):
    assert gc.isenabled() and gc.get_freeze_count() == 0
    client = daemon.client()
    fingerprint = expected_fingerprint(MODEL, 1, 0).fingerprint
    cycle = [Buffer()]
    cycle.append(cycle)
    buffer = weakref.ref(cycle[0])
    del cycle
    with client.attach(fingerprint, tensor_format="torch"):
        # Moved to the oldest generation, it would outlive every young and middle pass.
        gc.collect(1)
        assert buffer() is None, "the garbage the process made before the attach is freed"
    client.close()


def test_objects_the_process_froze_stay_frozen(daemon):
    mine = [[] for _ in range(3)]
    gc.freeze()
    try:
        assert not any(in_generation(mine, None)), "frozen: in no generation"
        client = daemon.client()
        with client.attach(expected_fingerprint(MODEL, 1, 0).fingerprint, tensor_format="torch"):
            assert gc.isenabled()
            assert gc.get_freeze_count() > 0
            assert not any(in_generation(mine, None)), "still frozen after the attach"
        client.close()
    finally:
        gc.unfreeze()
