"""A hot swap (``weightd ctl load`` of another checkpoint directory under a name that has written
versions) and what a restart serves after it, with ``--keeper`` (issue 31, docs/weight-updates.md,
docs/spec/kept-written.md). The swap drains every older version of the name, the written ones
included, and has the keeper drop their records before it serves (ModelControl's dropsOlderFirst;
a draining rank drops its record again as its drain begins: UNKEEP in src/models/modelMachine.ts),
even while a reader holds one, so a restart, even a crash right after
the swap's reply, finds no written version of the name to make current: it serves version 0 of the checkpoint it plans, whether that is the
command line's (which wins over the swapped-in directory's load request) or, for a model loaded at
run time, the swapped-in directory (the newest load request). A swap back to the directory the
versions were written over does not bring them back either.

The swapped-in version's records carry no currentSince; these tests hold that no written version
is left for one to be chosen over it. Without both drops every test here but the run-time model
swapped to another directory fails (that one the directory check of docs/spec/kept-written.md §3
also refuses): the restart serves the drained written version as current. That the reply waits for
the drops: test_update_keeper_swap_drop.py."""

import json
import os
import tempfile
from pathlib import Path

import pytest

from daemon_fixture import DEVICE
from test_switch import ctl
from test_update_keeper import NAME, _node, end, fingerprint, kept, read_all, write_two_versions
from versions import other_version

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="writers are built on the host backend")


@pytest.fixture
def node():
    """test_update_keeper's node, and its directory (for the other checkpoints)."""
    with tempfile.TemporaryDirectory(prefix="weightd-keepswap-") as tmp:
        for start, model in _node(Path(tmp)):
            yield start, model, Path(tmp)


def swap(daemon, name, model, plan):
    ctl(daemon, "load", "--model", model, "--name", name, "-tp", "1", "--plan-file", plan)


def all_versions(daemon, name):
    """{version: current} of ``name``'s versions that serve."""
    return {m["version"]: m["current"] for m in json.loads(ctl(daemon, "list", "--json"))["models"] if m["name"] == name and m["state"] == "serving"}


def serving_model_dir(daemon, name):
    return {m["model"] for m in json.loads(ctl(daemon, "list", "--json"))["models"] if m["name"] == name and m["state"] == "serving"}


@pytest.mark.parametrize("back", [False, True], ids=["swapped", "swapped-back"])
def test_a_restart_after_a_hot_swap_of_the_command_lines_model_serves_no_written_version(node, back):
    start, model, tmp = node
    plan = str(tmp / "plan.json")
    other = str(tmp / "other")
    other_version(model, other, 0x0F)
    daemon = start()
    write_two_versions(daemon)
    # A reader holds the current written version through the swap: it drains but stays resident,
    # so only the drain's own drop (not its release) takes its record from the keeper.
    with daemon.client(0) as client:
        reader = client.attach(fingerprint(client, 2), tensor_format="numpy")
        swap(daemon, NAME, other, plan)
        assert all_versions(daemon, NAME) == {0: True}, "the swap drained every older version, the written ones too"
        if back:
            swap(daemon, NAME, model, plan)
            assert all_versions(daemon, NAME) == {0: True}
        # The swap's reply came: a crash right after it must not serve a version the swap drained.
        end(daemon, "SIGKILL")
        del reader

    daemon = start()
    # The command line names the first directory, and wins over the swapped-in one's load request.
    assert all_versions(daemon, NAME) == {0: True}, daemon.stderr
    assert serving_model_dir(daemon, NAME) == {model}
    assert not [s for s in kept(daemon) if s["version"] not in (0, None)], kept(daemon)


@pytest.mark.parametrize("back", [False, True], ids=["swapped", "swapped-back"])
def test_a_restart_after_a_hot_swap_of_a_model_loaded_at_run_time_serves_its_newest_checkpoint_with_no_written_version(node, back):
    start, model, tmp = node
    plan = str(tmp / "plan.json")
    first, second = str(tmp / "rt-a"), str(tmp / "rt-b")
    other_version(model, first, 0x33)
    other_version(model, second, 0x55)
    name = "rt"
    daemon = start()
    swap(daemon, name, first, plan)
    with daemon.client(0) as client:
        base = next(v["fingerprint"] for v in client.ping()["models"] if v["name"] == name and v.get("version") == 0)
        v0 = read_all(client, base)
        t = sorted(v0)[0]
        with client.begin_update(name, base, tensors=[t]) as upd:
            upd.write(t, bytes((b + 1) % 256 for b in v0[t]))
            committed = upd.commit()
        assert committed["version"] == 1
        v1 = committed["fingerprint"]
        assert all_versions(daemon, name) == {0: False, 1: True}
        reader = client.attach(v1, tensor_format="numpy")
        swap(daemon, name, second, plan)
        if back:
            swap(daemon, name, first, plan)
        assert all_versions(daemon, name) == {0: True}
        end(daemon, "SIGKILL")
        del reader

    daemon = start()
    assert all_versions(daemon, name) == {0: True}, daemon.stderr
    assert serving_model_dir(daemon, name) == {first if back else second}
