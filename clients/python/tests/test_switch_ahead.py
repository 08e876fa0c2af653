"""SwitchAhead (weightd_client/switch_ahead.py) on the host backend, against a real daemon whose
writers commit versions: each version made ready is prepared on the thread (its lease taken, its
changed segments mapped aside) while the reader still reads its own, so the switch asks the daemon
for nothing and only remaps; a newer version, a switch elsewhere, a rollback and ``stop`` each give
back what was held, and after a daemon restart the thread watches again."""

import contextlib
import json
import os

import pytest

from daemon_fixture import DEVICE, Daemon, counting_fds
from test_host_fds import MODEL
from test_switch import ctl, raw, segment_maps, wait_for
from versions import other_version
from weightd_client.protocol import ServeError
from weightd_client.switch_ahead import SwitchAhead

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="writers are built on the host backend")
np = pytest.importorskip("numpy")

NAME = "ahead"


def plan_args(tmp):
    """Segments of about 1 MiB (a plan file's segmentBytes), so an update of one tensor changes one
    segment of several."""
    plan = tmp / "plan.json"
    plan.write_text('{"rules": [], "segmentBytes": 1048576}')
    return ["--plan-file", str(plan), "--keep-versions", "1"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ahead")
    path = str(tmp / NAME)
    other_version(MODEL, path)
    return path, plan_args(tmp)


@pytest.fixture
def served(model):
    path, args = model
    with Daemon(path, args) as d:
        yield d


def mine(client, fingerprint):
    """This process's leases on a version (none once the daemon freed it)."""
    try:
        return [l for l in client.stats(fingerprint)["leases"] if l["pid"] == os.getpid()]
    except ServeError as err:
        assert err.code == "E_UNKNOWN_MODEL", err
        return []


def commit_one(client, reader, base, tag):
    """A new version over ``base`` in which the last segment's first non-empty tensor is changed:
    (its fingerprint, that tensor's name, its new bytes)."""
    last = max(seg["segment"] for seg in reader.state["segments"])
    name = next(t["name"] for t in reader.state["tensors"] if t["segment"] == last and raw(reader.tensors[t["name"]]))
    new = bytes((b + tag) % 256 for b in raw(reader.tensors[name]))
    with client.begin_update(NAME, base, tensors=[name]) as upd:
        upd.write(name, new)
        return upd.commit()["fingerprint"], name, new


@contextlib.contextmanager
def reading(daemon):
    """A client, a reader of the version that serves (its base fingerprint), the segment mappings
    before any switch is prepared, and a SwitchAhead on the reader's mapping; stopped and detached after."""
    with daemon.client() as client:
        base = next(m["fingerprint"] for m in client.ping()["models"] if m["name"] == NAME)
        reader = client.attach(base, tensor_format="numpy")
        maps = segment_maps()
        ahead = SwitchAhead(client.socket_path, reader._mapping, "checkpoint").start()
        try:
            yield client, reader, base, maps, ahead
        finally:
            ahead.stop()
            reader.detach()


def test_a_version_made_ready_is_prepared_on_the_thread_and_the_switch_only_remaps(served):
    with reading(served) as (client, reader, base, maps, ahead):
        before = {n: raw(v) for n, v in reader.tensors.items()}
        addresses = {n: v.ctypes.data for n, v in reader.tensors.items()}
        assert ahead.names == [NAME]
        fp, changed, new = commit_one(client, reader, base, 3)
        assert ahead.prepared(fp, timeout=60), "the thread prepares the version the commit made ready"
        assert len(segment_maps()) == len(maps) + 1, "the changed segment is mapped aside, once"
        assert {n: raw(v) for n, v in reader.tensors.items()} == before, "the views read the mapped version until the switch"
        assert [l["mode"] for l in mine(client, fp)] == ["map"], "the prepared switch holds the version's lease"
        received = counting_fds(client)
        with ahead.switching(fp, client) as pending:
            assert pending is not None and pending.fingerprint == fp
            state = client.finish_switch(reader._mapping, pending, reader.lease_id)
        reader.lease_id, reader.state = state["leaseId"], state
        assert received == [], "what the thread prepared is used: no descriptor asked for at the switch"
        assert reader.last_switch["remapped"] == [max(s["segment"] for s in state["segments"])]
        assert {n: raw(v) for n, v in reader.tensors.items()} == {**before, changed: new}
        assert {n: v.ctypes.data for n, v in reader.tensors.items()} == addresses
        client.settle()
        assert mine(client, base) == [], "the version switched from keeps no lease of this process"
        assert ahead.idle(), "nothing is held once the switch took it"


def test_a_newer_version_a_switch_elsewhere_and_a_rollback_each_give_back_what_was_prepared(served):
    with reading(served) as (client, reader, base, maps, ahead):
        v1, _, _ = commit_one(client, reader, base, 5)
        assert ahead.prepared(v1, timeout=60)
        # A newer version is the one to switch to next: v1's preparation is given back.
        v2, changed, new = commit_one(client, reader, v1, 7)
        assert ahead.prepared(v2, timeout=60)
        assert mine(client, v1) == [], "the version prepared before the newer one keeps no lease of this process"
        assert len(segment_maps()) == len(maps) + 1, "only the newer version's segment is mapped aside"
        # A switch to another version than the one held: that one is given back, and the
        # switch prepares its own.
        with ahead.switching(base, client) as pending:
            assert pending is None
        assert mine(client, v2) == [] and segment_maps() == maps
        # Prepared again for v3; then a rollback to the version the reader maps makes that one
        # current: nothing is left to prepare, and v3's preparation is given back.
        v3, _, _ = commit_one(client, reader, v2, 9)
        assert ahead.prepared(v3, timeout=60)
        version_of = {m["fingerprint"]: m["version"] for m in client.ping()["models"] if m["name"] == NAME}
        assert version_of[v3] == 3
        ctl(served, "rollback", NAME, str(version_of[v2]))
        assert wait_for(lambda: ahead.prepared(v2)), "a rollback's model_ready is prepared like any other"
        assert mine(client, v3) == []
        ahead.stop()
        assert ahead.idle() and segment_maps() == maps, "stop gives back what it held"
        assert mine(client, v2) == [], "and its lease"
        assert not ahead._thread.is_alive()


def test_a_prepared_version_that_drains_is_given_back(served):
    with reading(served) as (client, reader, base, maps, ahead):
        v1, _, _ = commit_one(client, reader, base, 13)
        assert ahead.prepared(v1, timeout=60)
        # Unloaded with no newer version made ready: only its model_dropping says so.
        model_fp = next(m["fingerprint"] for m in json.loads(ctl(served, "list", "--json"))["models"] if m["name"] == NAME and m.get("version") == 1)
        ctl(served, "unload", model_fp)
        assert ahead.idle(timeout=60), "a held version that drains is given back"
        assert wait_for(lambda: mine(client, v1) == []), "with its lease, so the daemon frees it"
        assert segment_maps() == maps


def test_after_the_daemon_restarts_the_thread_watches_again(model, tmp_path):
    path, args = model
    maps = segment_maps()
    socket_dir = str(tmp_path / "s")
    os.mkdir(socket_dir, 0o700)
    first = Daemon(path, args, socket_dir=socket_dir, host_device=f"ah{os.getpid()}")
    try:
        with first.client() as client:
            base = next(m["fingerprint"] for m in client.ping()["models"] if m["name"] == NAME)
            reader = client.attach(base, tensor_format="numpy")
            socket_path = client.socket_path
    finally:
        first.stop()
    ahead = None
    try:
        second = Daemon(path, args, socket_dir=socket_dir, host_device=f"ah{os.getpid()}")
        try:
            # Started against the first daemon's mapping, on the second's socket (the same path).
            ahead = SwitchAhead(socket_path, reader._mapping, "checkpoint").start()
            second.stop()
            third = Daemon(path, args, socket_dir=socket_dir, host_device=f"ah{os.getpid()}")
            try:
                with third.client() as client:
                    fp, _, _ = commit_one(client, reader, base, 11)
                    assert ahead.prepared(fp, timeout=60), "the thread watched the restarted daemon again"
                    ahead.stop()
                    assert mine(client, fp) == []
            finally:
                third.stop()
        finally:
            second.stop()
    finally:
        if ahead is not None:
            ahead.stop()
        # The daemon that granted the lease is gone, and so is the lease: only the mapping is left.
        reader.tensors = {}
        reader._mapping.close()
        assert segment_maps() == maps
