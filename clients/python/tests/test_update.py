"""Writers on the host backend, against a real daemon (docs/weight-updates.md): a version written
over a served one is invisible until committed, then serves as the model's newest version, which
a reader reaches with switch_to; the daemon refuses to seal memory still mapped writable; a writer
killed mid-update leaves nothing, in the daemon's descriptors or in its list."""

import json
import mmap
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from daemon_fixture import DEVICE, MAIN_JS, Daemon
from test_host_fds import MODEL
from test_switch import ctl, raw, wait_for
from versions import other_version
from weightd_client import expected_fingerprint
from weightd_client.protocol import ServeError
from weightd_client.update import commit_all
from weightd_client.write_version import serving_fingerprint

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="writers are built on the host backend")
np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

NAME = "upd"

#: Clients the running test opened: closed after it, so no descriptor of it outlives it (test_switch counts them).
_opened = []


def open_client(daemon, rank=0):
    """A client of ``daemon``'s rank ``rank``, closed when the test ends."""
    c = daemon.client(rank)
    _opened.append(c)
    return c


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _opened:
        _opened.pop().close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The own model, and a second one named ``upd`` (a model actor): the one the writers update."""
    model = str(tmp_path_factory.mktemp("update") / NAME)
    other_version(MODEL, model)
    with Daemon(MODEL, ["--model", model, "-tp", "1"]) as d:
        yield d, model


def models(daemon):
    """ctl list --json's versions of ``upd`` that serve (the current one and those retained)."""
    return [m for m in json.loads(ctl(daemon, "list", "--json"))["models"] if m["name"] == NAME and m["state"] == "serving"]


def current(daemon):
    """The fingerprint of the version of ``upd`` that clients are pointed to now (rank 0's)."""
    ours = [m for m in models(daemon) if m["current"]]
    assert len(ours) == 1, ours
    return rank_fingerprint(daemon, ours[0]["version"])


def rank_fingerprint(daemon, version):
    """Rank 0's fingerprint of version ``version`` of ``upd``, as the socket lists it."""
    return next(v["fingerprint"] for v in open_client(daemon, 0).ping()["models"] if v["name"] == NAME and v.get("version") == version and v["status"] == "serving")


def update_memfds(pid, writable=False):
    """The daemon's descriptors of written segments (native/update_segments.cpp names them): its
    writable copies (``writable``: opened read-write) or, besides them, the read-only ones a
    committed version serves from."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}", encoding="utf-8") as f:
                flags = int(next(line.split()[1] for line in f if line.startswith("flags:")), 8)
        except (OSError, StopIteration):
            continue
        if target.startswith("/memfd:weightd:update:") and (not writable or flags & os.O_ACCMODE == os.O_RDWR):
            out.append(f"{fd} {target}")
    return sorted(out)


def listed(daemon):
    """ctl list's lines for ``upd``, without the leases column (a reader's lease may come and go)."""
    return sorted(" ".join(w for w in line.split() if not w.startswith("leases=")) for line in ctl(daemon, "list").splitlines() if line.startswith(NAME + " "))


def test_a_reader_sees_only_its_version_until_it_switches(served):
    daemon, _ = served
    client = open_client(daemon, 0)
    base = current(daemon)
    reader = client.attach(base, tensor_format="numpy")
    names = sorted(reader.tensors)
    changed, kept = names[0], names[1]
    old_changed, old_kept = raw(reader.tensors[changed]), raw(reader.tensors[kept])
    new_bytes = bytes((b + 1) % 256 for b in old_changed)
    with client.begin_update(NAME, base) as upd:
        view = upd.tensor(changed, tensor_format="torch")
        view.view(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(new_bytes), dtype=torch.uint8))
        del view
        # Written but not committed: the reader's version is untouched, and no new version serves.
        assert raw(reader.tensors[changed]) == old_changed
        assert current(daemon) == base
        done = upd.commit()
    assert done["waiting"] == [] and done["version"] == 1
    assert done["fingerprint"] != base
    # Its sealed segments are adopted on the daemon's main thread: no worker thread is started for a commit.
    assert [r["source"] for m in models(daemon) if m["version"] == 1 for r in m["ranks"]] == [{"from": "writer", "thread": "main"}]
    # Committed: the reader still reads the version it attached to, byte for byte...
    assert raw(reader.tensors[changed]) == old_changed
    assert current(daemon) == done["fingerprint"]
    # ...until it switches, at the same addresses.
    address = reader.tensors[changed].ctypes.data
    reader.switch_to(done["fingerprint"])
    assert reader.tensors[changed].ctypes.data == address
    assert raw(reader.tensors[changed]) == new_bytes
    assert raw(reader.tensors[kept]) == old_kept, "a tensor the writer did not write keeps the base's bytes"
    reader.detach()
    assert not update_memfds(daemon.proc.pid, writable=True), "the writable copies are closed once the version serves"
    assert update_memfds(daemon.proc.pid), "the version serves from read-only descriptors of its own"


def test_commit_is_refused_while_the_writer_maps_a_segment_writable(served):
    daemon, _ = served
    client = open_client(daemon, 0)
    base = current(daemon)
    with client.begin_update(NAME, base) as upd:
        # A mapping the writer keeps: a view left alive when it commits.
        kept = upd.tensor(sorted(upd.tensors)[0])
        with pytest.raises(ServeError) as refused:
            upd.commit()
        assert refused.value.code == "E_UPDATE_MAPPED"
        del kept
        assert upd.commit()["version"] >= 1


def test_the_daemon_refuses_to_seal_a_segment_another_mapping_can_write(served):
    daemon, _ = served
    base = current(daemon)
    from weightd_client.protocol import Connection, close_fds

    conn = Connection(open_client(daemon, 0).socket_path)
    try:
        reply, fds = conn.request_fds("begin_update", model=NAME, base=base)
        mapped = mmap.mmap(fds[0], reply["segments"][0]["bytes"], flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        close_fds(fds)
        first = next(t for t in reply["tensors"] if t["segment"] == 0 and t["bytes"] > 0)
        mapped[first["offset"]] = (mapped[first["offset"]] + 1) % 256
        with pytest.raises(ServeError) as refused:
            conn.request("commit_update", update=reply["update"])
        assert refused.value.code == "E_UPDATE_MAPPED"
        assert "unmap" in str(refused.value)
        assert current(daemon) == base, "a refused commit serves nothing"
        mapped.close()
        assert conn.request("commit_update", update=reply["update"])["waiting"] == []
        assert current(daemon) != base
    finally:
        conn.close()


def test_one_update_of_a_model_at_a_time(served):
    daemon, _ = served
    base = current(daemon)
    with open_client(daemon, 0).begin_update(NAME, base):
        with pytest.raises(ServeError) as busy:
            open_client(daemon, 0).begin_update(NAME, base)
        assert busy.value.code == "E_UPDATE_BUSY"
        assert busy.value.details["model"] == NAME
    # Abandoned (its connection closed): the next one may begin.
    with open_client(daemon, 0).begin_update(NAME, base):
        pass


def test_leaving_an_update_with_a_view_alive_still_abandons_it(served):
    daemon, _ = served
    base = current(daemon)

    class Stop(Exception):
        pass

    # An exception inside the with keeps its frame's views alive (its traceback holds them): the
    # update still ends, and the exception that left the block is the one raised.
    with pytest.raises(Stop):
        with open_client(daemon, 0).begin_update(NAME, base) as upd:
            view = upd.tensor(sorted(upd.tensors)[0])
            raise Stop()
    del view
    with open_client(daemon, 0).begin_update(NAME, base):
        pass


def test_a_commit_of_a_written_versions_bytes_is_that_version(served):
    daemon, _ = served
    client = open_client(daemon, 0)
    # A written version of its own first, whatever the tests before left current (a checkpoint
    # version's bytes written back are a new version: its fingerprint follows other rules).
    reader = client.attach(current(daemon), tensor_format="numpy")
    name = sorted(reader.tensors)[0]
    changed = bytes((b + 3) % 256 for b in raw(reader.tensors[name]))
    reader.detach()
    with client.begin_update(NAME, current(daemon)) as upd:
        upd.write(name, changed)
        written = upd.commit()["fingerprint"]
    assert current(daemon) == written
    before = listed(daemon)
    with client.begin_update(NAME, written) as upd:
        done = upd.commit()
    assert done["fingerprint"] == written, "the same content has the same fingerprint"
    assert current(daemon) == written
    assert listed(daemon) == before, "nothing new serves"


def test_rollback_makes_a_retained_version_current_with_no_copy_and_switch_to_reads_its_bytes(served):
    daemon, _ = served
    client = open_client(daemon, 0)
    base = current(daemon)
    base_version = next(m["version"] for m in models(daemon) if m["current"])
    reader = client.attach(base, tensor_format="numpy")
    name = sorted(reader.tensors)[0]
    old = raw(reader.tensors[name])
    with client.begin_update(NAME, base) as upd:
        upd.write(name, bytes((b + 7) % 256 for b in old))
        done = upd.commit()
    reader.switch_to(done["fingerprint"])
    assert raw(reader.tensors[name]) != old
    # The base is retained: resident, not current, and listed so.
    retained = [m for m in models(daemon) if m["version"] == base_version]
    assert len(retained) == 1 and retained[0]["current"] is False
    assert f"v{base_version} (retained)" in ctl(daemon, "list")
    watcher = open_client(daemon, 0)
    watcher.watch(NAME)
    out = ctl(daemon, "rollback", NAME, str(base_version))
    assert f"{NAME} version {base_version}" in out and "is current now" in out
    assert current(daemon) == base
    ready = [e for e in watcher.events(timeout=30) if e["event"] == "model_ready"]
    assert ready and ready[0]["fingerprint"] == base and ready[0]["version"] == base_version
    # The reader follows back, at the same addresses, to the base's bytes.
    reader.switch_to(base)
    assert raw(reader.tensors[name]) == old
    reader.detach()
    assert "was current already" in ctl(daemon, "rollback", NAME, str(base_version))


def test_a_rollback_to_a_version_not_resident_names_those_that_are(served):
    daemon, _ = served
    r = subprocess.run(["node", str(MAIN_JS), "ctl", "--weight-cache-socket-dir", daemon.socket_dir, "rollback", NAME, "999"],
                       env={**os.environ, "WEIGHTD_HOST_DEVICES": daemon.device}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "E_UNKNOWN_VERSION" in r.stderr and "999" in r.stderr
    held = sorted(m["version"] for m in models(daemon))
    assert f"it holds versions {', '.join(map(str, held))}" in r.stderr
    bad = subprocess.run(["node", str(MAIN_JS), "ctl", "--weight-cache-socket-dir", daemon.socket_dir, "rollback", NAME, "latest"],
                         env={**os.environ, "WEIGHTD_HOST_DEVICES": daemon.device}, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2, "a version that is not a number is a usage error"
    assert "E_USAGE" in bad.stderr and 'latest' in bad.stderr


def test_commits_beyond_keep_versions_drain_the_oldest(served):
    daemon, _ = served
    for step in range(3):
        base = current(daemon)
        with open_client(daemon, 0).begin_update(NAME, base) as upd:
            name = sorted(upd.tensors)[step]
            upd.write(name, bytes(upd.tensors[name]["bytes"]))
            upd.write(sorted(upd.tensors)[-1], bytes([step + 1]) * upd.tensors[sorted(upd.tensors)[-1]]["bytes"])
            done = upd.commit()
    # The daemon runs with the default --keep-versions 2: the current version and the 2 newest before it.
    versions = sorted(m["version"] for m in models(daemon))
    assert len(versions) == 3, versions
    assert versions[-1] == done["version"]
    assert next(m for m in models(daemon) if m["current"])["version"] == done["version"]


def test_a_rollback_while_an_update_is_written_is_not_undone_by_its_commit(served):
    """The operator rolls back while a writer writes over the version that was current: the
    commit is refused (E_UPDATE_BASE) rather than serve a version written over what the operator
    moved away from, and the version rolled back to stays current."""
    daemon, _ = served
    with open_client(daemon, 0).begin_update(NAME, current(daemon)) as first:
        name = sorted(first.tensors)[0]
        first.write(name, bytes([5]) * first.tensors[name]["bytes"])
        first.commit()
    older = max(m["version"] for m in models(daemon) if not m["current"])
    upd = open_client(daemon, 0).begin_update(NAME, current(daemon))
    try:
        upd.write(name, bytes([9]) * upd.tensors[name]["bytes"])
        assert "is current now" in ctl(daemon, "rollback", NAME, str(older))
        with pytest.raises(ServeError) as refused:
            upd.commit()
    finally:
        upd.abandon()
    assert refused.value.code == "E_UPDATE_BASE"
    assert "is no longer current (a hot swap or a rollback chose fingerprint" in str(refused.value)
    assert next(m for m in models(daemon) if m["current"])["version"] == older


def test_a_base_that_is_not_served_is_refused_naming_what_is(served):
    daemon, _ = served
    with pytest.raises(ServeError) as refused:
        open_client(daemon, 0).begin_update(NAME, "0" * 64)
    assert refused.value.code == "E_UPDATE_BASE"
    assert current(daemon) in str(refused.value)


def test_a_writer_killed_mid_update_leaves_nothing(served):
    daemon, _ = served
    base = current(daemon)
    before, held = listed(daemon), update_memfds(daemon.proc.pid)
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from weightd_client import WeightdClient
            upd = WeightdClient({open_client(daemon, 0).socket_path!r}).begin_update({NAME!r}, {base!r})
            name = sorted(upd.tensors)[0]
            upd.tensor(name)[...] = 0
            print("writing", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as writer:
        assert writer.stdout.readline().strip() == "writing"
        assert update_memfds(daemon.proc.pid, writable=True), "the daemon holds the update's copies while it is written"
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert wait_for(lambda: update_memfds(daemon.proc.pid) == held), update_memfds(daemon.proc.pid)
    assert listed(daemon) == before
    assert current(daemon) == base
    # Nothing of it holds the model: another update begins at once.
    with open_client(daemon, 0).begin_update(NAME, base):
        pass


@pytest.fixture(scope="module")
def served_tp2(tmp_path_factory):
    """A model of two local ranks (two host devices), named ``upd``, beside the own model."""
    model = str(tmp_path_factory.mktemp("update-tp2") / NAME)
    other_version(MODEL, model)
    with Daemon(MODEL, ["--model", model, "-tp", "2"], tp=2) as d:
        yield d


def rank_fingerprints(daemon):
    """Each rank's fingerprint of the version of ``upd`` its socket points clients to (the newest that serves)."""
    out = []
    for rank in (0, 1):
        serving = [v for v in open_client(daemon, rank).ping()["models"] if v["name"] == NAME and v["status"] == "serving"]
        out.append(max(serving, key=lambda v: v["version"])["fingerprint"])
    return out


def test_a_version_of_several_ranks_serves_only_once_every_rank_committed(served_tp2):
    daemon = served_tp2
    bases = rank_fingerprints(daemon)
    first = open_client(daemon, 0).begin_update(NAME, bases[0])
    second = open_client(daemon, 1).begin_update(NAME, bases[1])
    try:
        for upd in (first, second):
            name = sorted(upd.tensors)[0]
            upd.write(name, bytes(upd.tensors[name]["bytes"]))
        assert first.commit()["waiting"] == [1]
        # Rank 0 committed, rank 1 not: nothing new is visible on either socket.
        assert rank_fingerprints(daemon) == bases
        done = commit_all([first, second])
    finally:
        first.abandon()
        second.abandon()
    assert done["waiting"] == [] and done["version"] == 1
    now = rank_fingerprints(daemon)
    assert now[1] == done["fingerprint"] and now[0] != bases[0]


def test_a_rank_whose_writer_goes_ends_the_update_of_every_rank(served_tp2):
    daemon = served_tp2
    bases, before = rank_fingerprints(daemon), listed(daemon)
    first = open_client(daemon, 0).begin_update(NAME, bases[0])
    second = open_client(daemon, 1).begin_update(NAME, bases[1])
    assert first.commit()["waiting"] == [1]
    # Rank 1's connection ends uncommitted: rank 0's committed part goes with it.
    second.abandon()
    assert wait_for(lambda: not update_memfds(daemon.proc.pid, writable=True)), update_memfds(daemon.proc.pid, writable=True)
    first.abandon()
    assert rank_fingerprints(daemon) == bases
    assert listed(daemon) == before


def test_connections_ending_on_another_rank_s_socket_leave_an_update_alone(served_tp2):
    """The update desk is the node's, for every rank's socket: a connection that ends on rank 1's
    socket is never taken for the writer's on rank 0's. (Each socket numbered its connections from
    1, so rank 1's short connections, as many as rank 0 had before, reached the writer's number.)"""
    daemon = served_tp2
    for _ in range(30):
        with daemon.client(0) as c:
            c.ping()
    bases = rank_fingerprints(daemon)
    parts = [open_client(daemon, rank).begin_update(NAME, bases[rank]) for rank in (0, 1)]
    try:
        for _ in range(60):
            with daemon.client(1) as c:
                c.ping()
        for upd in parts:
            name = sorted(upd.tensors)[0]
            upd.write(name, bytes(upd.tensors[name]["bytes"]))
        done = commit_all(parts)
    finally:
        for upd in parts:
            upd.abandon()
    assert done["waiting"] == [] and rank_fingerprints(daemon)[1] == done["fingerprint"]


def test_ranks_that_write_one_replicated_tensor_differently_commit_nothing(served_tp2):
    """Both ranks hold the whole of a replicated tensor: written with different bytes on each, the
    last commit is refused by the tensor's name and nothing of the update serves; written alike,
    it commits."""
    daemon = served_tp2
    bases, before = rank_fingerprints(daemon), listed(daemon)
    norm = "model.norm.weight"
    parts = [open_client(daemon, rank).begin_update(NAME, bases[rank], tensors=[norm]) for rank in (0, 1)]
    try:
        for rank, upd in enumerate(parts):
            upd.write(norm, bytes([rank + 1]) * upd.tensors[norm]["bytes"])
        assert parts[0].commit()["waiting"] == [1]
        with pytest.raises(ServeError) as refused:
            parts[1].commit()
    finally:
        for upd in parts:
            upd.abandon()
    assert refused.value.code == "E_UPDATE_REPLICAS"
    assert f"{norm} (replicated) on ranks 0 and 1" in str(refused.value)
    assert rank_fingerprints(daemon) == bases
    assert listed(daemon) == before
    parts = [open_client(daemon, rank).begin_update(NAME, bases[rank], tensors=[norm]) for rank in (0, 1)]
    try:
        for upd in parts:
            upd.write(norm, bytes([7]) * upd.tensors[norm]["bytes"])
        done = commit_all(parts)
    finally:
        for upd in parts:
            upd.abandon()
    assert done["waiting"] == [] and rank_fingerprints(daemon)[0] != bases[0]


def held_memfd_bytes(pid):
    """The bytes of every segment the daemon holds (its memfds named weightd:..., each file once
    however many descriptors it has): what it holds on the host device, counted from /proc."""
    sizes = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:weightd:"):
                st = os.stat(path)
                sizes[st.st_ino] = st.st_size
        except OSError:
            continue
    return sum(sizes.values())


def test_get_memory_counts_every_version_held_and_shared_segments_once(tmp_path):
    """What an engine subtracts from its budget: every version the daemon holds on the device (the
    checkpoint's, and a partial update's that shares all but one of its 1 MiB segments with it),
    each segment's memory once: the daemon's memfds as /proc shows them."""
    from weightd_client import get_memory

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"rules": [], "segmentBytes": 1 << 20}))
    with Daemon(MODEL, ["--plan-file", str(plan)]) as daemon:
        with daemon.client(0) as client:
            name = next(v["name"] for v in client.ping()["models"])
            base = serving_fingerprint(client, name)
            one = client.stats(base)["deviceBytes"]
            assert get_memory(socket_path=client.socket_path) == held_memfd_bytes(daemon.proc.pid) == one
            with client.begin_update(name, base, tensors=["model.norm.weight"]) as upd:
                upd.write("model.norm.weight", bytes([3]) * upd.tensors["model.norm.weight"]["bytes"])
                assert upd.commit()["waiting"] == []
            held = get_memory(socket_path=client.socket_path)
        assert held == held_memfd_bytes(daemon.proc.pid)
        assert one < held < 2 * one, "the update's version shares the base's other segments: counted once"


def test_write_takes_numpy_arrays_torch_tensors_and_bytes_of_the_tensors_size(served):
    daemon, _ = served
    with open_client(daemon, 0).begin_update(NAME, current(daemon)) as upd:
        a, b = sorted(upd.tensors)[:2]
        size_a, size_b = upd.tensors[a]["bytes"], upd.tensors[b]["bytes"]
        upd.write(a, np.full(size_a, 3, dtype=np.uint8))
        upd.write(b, torch.full((size_b,), 5, dtype=torch.uint8))
        assert raw(upd.tensor(a)) == bytes([3]) * size_a
        assert raw(upd.tensor(b, tensor_format="torch")) == bytes([5]) * size_b
        with pytest.raises(Exception) as wrong:
            upd.write(a, bytes(size_a + 1))
        assert wrong.value.code == "E_BAD_SIZE" and str(size_a) in str(wrong.value)


def test_the_node_s_first_model_takes_a_writer_and_a_rollback_like_any_other(served):
    daemon, _ = served
    c = open_client(daemon, 0)
    first = c.ping()
    name, base = first["name"], first["fingerprint"]
    reader = c.attach(base, tensor_format="numpy")
    tensor = sorted(reader.tensors)[0]
    old = raw(reader.tensors[tensor])
    with c.begin_update(name, base) as upd:
        upd.write(tensor, bytes((b + 1) % 256 for b in old))
        done = upd.commit()
    assert done["version"] >= 1 and done["fingerprint"] != base
    reader.switch_to(done["fingerprint"])
    assert raw(reader.tensors[tensor]) != old
    assert "is current now" in ctl(daemon, "rollback", name, "0")
    reader.switch_to(base)
    assert raw(reader.tensors[tensor]) == old
    reader.detach()
