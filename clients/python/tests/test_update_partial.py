"""Partial updates (issue 31, docs/weight-updates.md): a writer that names the tensors it writes
gets writable copies of only the segments holding them; every other segment of the new version
is the base's own sealed memfd, shared, and stays readable after the base is gone."""

import json
import os

import pytest

from daemon_fixture import DEVICE, Daemon, counting_fds
from test_host_fds import MODEL
from test_switch import ctl, raw, wait_for
from test_update import update_memfds
from versions import other_version
from weightd_client.protocol import ProtocolError, ServeError

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="writers are built on the host backend")
np = pytest.importorskip("numpy")

NAME = "part"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Model ``part`` (the node's model), its arena cut into segments of about 1 MiB (a plan file's segmentBytes),
    with no earlier version retained after a commit (so the base drains)."""
    tmp = tmp_path_factory.mktemp("partial")
    model = str(tmp / NAME)
    other_version(MODEL, model)
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"rules": [], "segmentBytes": 1 << 20}))
    with Daemon(model, ["--plan-file", str(plan), "--keep-versions", "0"]) as d:
        yield d


def serving(daemon):
    return [m for m in json.loads(ctl(daemon, "list", "--json"))["models"] if m["name"] == NAME and m["state"] == "serving"]


def base_segments(pid):
    """The daemon's descriptors of segments a fill made (not a writer's copies): {inode: memfd name}."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("/memfd:weightd:") and ":update:" not in target:
                out[os.stat(f"/proc/{pid}/fd/{fd}").st_ino] = target
        except OSError:
            continue
    return out


def rank_fingerprint(client, version):
    return next(v["fingerprint"] for v in client.ping()["models"] if v["name"] == NAME and v.get("version") == version and v["status"] == "serving")


def test_a_partial_update_copies_only_the_named_tensors_segments_and_the_rest_outlives_the_base(served):
    daemon = served
    with daemon.client(0) as client:
        (base,) = serving(daemon)
        base_fp = rank_fingerprint(client, base["version"])
        reader = client.attach(base_fp, tensor_format="numpy")
        before = {name: raw(view) for name, view in reader.tensors.items()}
        reader.detach()
        # Where each tensor lies: a full update's begin lists every one (left without commit, it leaves nothing).
        with client.begin_update(NAME, base_fp) as full:
            layout = {name: t["segment"] for name, t in full.tensors.items()}
        segments = sorted(set(layout.values()))
        assert len(segments) > 2, f"the plan file cuts the arena into several segments: {segments}"
        changed = next(n for n in sorted(layout) if layout[n] == segments[1])
        other = next(n for n in sorted(layout) if layout[n] != segments[1])
        new_bytes = bytes((b + 1) % 256 for b in before[changed])

        filled = base_segments(daemon.proc.pid)
        assert len(filled) == len(segments)
        replaced = {ino for ino, target in filled.items() if target.endswith(f":s{segments[1]} (deleted)")}
        with client.begin_update(NAME, base_fp, tensors=[changed]) as upd:
            assert [layout[n] for n in upd.tensors] == [segments[1]]
            copies = update_memfds(daemon.proc.pid, writable=True)
            assert len(copies) == 1 and copies[0].endswith(f":s{segments[1]} (deleted)"), copies
            with pytest.raises(ProtocolError) as refused:
                upd.tensor(other)
            assert refused.value.code == "E_NOT_NAMED" and other in str(refused.value)
            upd.write(changed, new_bytes)
            done = upd.commit()
        assert done["version"] == base["version"] + 1

        # --keep-versions 0: the base drains and is released...
        assert wait_for(lambda: [m["version"] for m in serving(daemon)] == [done["version"]]), serving(daemon)
        assert wait_for(lambda: [v["status"] for v in client.ping()["models"] if v["name"] == NAME and v.get("version") == base["version"]] in ([], ["released"])), client.ping()["models"]
        # ...but for the segment written, the fill's memfds stay open: the new version's own descriptors of them...
        assert wait_for(lambda: set(base_segments(daemon.proc.pid)) == set(filled) - replaced), (filled, base_segments(daemon.proc.pid))
        # ...and the new version still reads the base's bytes in every segment it shares.
        reader = client.attach(done["fingerprint"], tensor_format="numpy")
        after = {name: raw(view) for name, view in reader.tensors.items()}
        reader.detach()
        assert after[changed] == new_bytes
        assert {n: b for n, b in after.items() if n != changed} == {n: b for n, b in before.items() if n != changed}


def test_a_partial_update_naming_a_tensor_the_model_does_not_hold_is_refused_naming_it(served):
    daemon = served
    with daemon.client(0) as client:
        (base,) = serving(daemon)
        with pytest.raises(ServeError) as refused:
            client.begin_update(NAME, rank_fingerprint(client, base["version"]), tensors=["no.such.weight"])
        assert refused.value.code == "E_UNKNOWN_TENSOR" and "no.such.weight" in str(refused.value)


def test_a_reader_switching_to_a_partial_update_remaps_only_the_written_segment_and_a_prepared_switch_only_moves_it(served):
    daemon = served
    with daemon.client(0) as client:
        received = counting_fds(client)
        (base,) = serving(daemon)
        reader = client.attach(rank_fingerprint(client, base["version"]), tensor_format="numpy")
        segments = sorted({seg["segment"] for seg in reader.state["segments"]})
        assert len(segments) > 2 and all(seg.get("memory", "").startswith("memfd:") for seg in reader.state["segments"])
        before = {name: raw(view) for name, view in reader.tensors.items()}
        addresses = {name: view.ctypes.data for name, view in reader.tensors.items()}
        segment_of = {t["name"]: t["segment"] for t in reader.state["tensors"]}
        changed = next(n for n in sorted(segment_of) if segment_of[n] == segments[-1] and before[n])
        new_bytes = bytes((b + 5) % 256 for b in before[changed])
        with client.begin_update(NAME, reader.state["fingerprint"], tensors=[changed]) as upd:
            upd.write(changed, new_bytes)
            done = upd.commit()
        received.clear()
        assert reader.prepare_switch(done["fingerprint"]) is reader
        assert received == [1], "prepare_switch asks for the written segment's descriptor only"
        assert {name: raw(view) for name, view in reader.tensors.items()} == before, "the views read the mapped version until switch_to"
        received.clear()
        reader.switch_to(done["fingerprint"])
        assert received == [], "what was prepared is used: no descriptor asked for again"
        assert reader.last_switch["remapped"] == [segments[-1]] and reader.last_switch["skipped"] == len(segments) - 1
        after = {name: raw(view) for name, view in reader.tensors.items()}
        assert after == {**before, changed: new_bytes}
        assert {name: view.ctypes.data for name, view in reader.tensors.items()} == addresses
        reader.tensors = {}
        reader.detach()
