"""Written versions survive a daemon restart with ``--keeper`` (issue 31, docs/weight-updates.md):
the keeper holds each version's sealed segments (those a version shares with its base once) with a
record of what serving it needs; the next daemon serves every version again with its number, its
bytes and the same current one, and a reader attached before the restart reads on from the same
memory. A checkpoint that changed meanwhile is loaded again from disk as version 0, while the
written versions, read from no file, serve on as written."""

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from daemon_fixture import DEVICE, MAIN_JS, Daemon
from test_host_fds import MODEL
from test_switch import ctl, raw, segment_maps, wait_for
from versions import other_version
from weightd_client.protocol import ServeError
from weightd_client.update import commit_all

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="writers are built on the host backend")
np = pytest.importorskip("numpy")

NAME = "kv"


@pytest.fixture
def node():
    """Start (and restart) a daemon with --keeper spawn on a model ``kv`` (its arena cut into segments
    of about 1 MiB, so that a partial update shares most of them), the same socket directory and
    host device each time; the keeper is stopped at the end. Its directory is its own, not pytest's
    tmp_path (whose old directories another pytest run of this user may remove meanwhile)."""
    with tempfile.TemporaryDirectory(prefix="weightd-keepver-") as tmp:
        yield from _node(Path(tmp))


def _node(tmp_path):
    model = str(tmp_path / NAME)
    other_version(MODEL, model, 0)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"rules": [], "segmentBytes": 1 << 20}))
    socket_dir = str(tmp_path / "sockets")
    os.mkdir(socket_dir, 0o700)
    started = []

    def start(tp=1, keeper="spawn"):
        d = Daemon(model, ["--keeper", keeper, "--plan-file", str(plan)], tp=tp, socket_dir=socket_dir, host_device=f"kv{os.getpid()}")
        started.append(d)
        return d

    yield start, model
    for d in started:
        d.stop()
    subprocess.run(["node", str(MAIN_JS), "keeper", "stop", "--weight-cache-socket-dir", socket_dir], capture_output=True, timeout=60)


def versions(daemon):
    """{version: current} of ``kv``'s versions that serve, as ctl list --json says."""
    return {m["version"]: m["current"] for m in json.loads(ctl(daemon, "list", "--json"))["models"] if m["name"] == NAME and m["state"] == "serving"}


def fingerprint(client, version):
    return next(v["fingerprint"] for v in client.ping()["models"] if v["name"] == NAME and v.get("version") == version and v["status"] == "serving")


def read_all(client, fp):
    """Every tensor's bytes of the version with rank fingerprint ``fp``."""
    reader = client.attach(fp, tensor_format="numpy")
    try:
        return {name: raw(view) for name, view in reader.tensors.items()}
    finally:
        reader.detach()


def segment_inodes(pid):
    """The distinct memfds (by inode) the process ``pid`` holds a descriptor of: each segment's memory once."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:weightd:"):
                out.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            continue
    return out


def write_two_versions(daemon):
    """v1 over v0 and v2 over v1, each a partial update of one tensor: only its segment is copied,
    the others are the base's memfds (v1's shared ones v0's own, so they outlive v0's files), and
    each commit reuses the base's digests of them. Returns {version: {tensor: bytes}}."""
    with daemon.client(0) as client:
        base = fingerprint(client, 0)
        v0 = read_all(client, base)
        names = sorted(v0)
        first, second = names[0], names[-1]
        with client.begin_update(NAME, base, tensors=[first]) as upd:
            upd.write(first, bytes((b + 1) % 256 for b in v0[first]))
            v1fp = upd.commit()["fingerprint"]
        v1 = read_all(client, v1fp)
        with client.begin_update(NAME, v1fp, tensors=[second]) as upd:
            upd.write(second, bytes((b + 2) % 256 for b in v1[second]))
            assert upd.commit()["version"] == 2
        v2 = read_all(client, fingerprint(client, 2))
    assert v1[first] != v0[first] and v2[second] != v1[second] and v2[first] == v1[first]
    # Each commit read only the tensors of the segment it copied: a checkpoint base's digests (v1) and a written one's (v2) served for the rest.
    sealed = lambda: [json.loads(line) for line in daemon.stderr_lines if '"update sealed' in line]  # noqa: E731
    assert wait_for(lambda: len(sealed()) == 2), "the log's lines reach the test through a thread"
    assert [(s["tensors"], 0 < s["read"] < s["tensors"]) for s in sealed()] == [(len(v0), True)] * 2, sealed()
    # A commit's reply comes once the keeper holds its version's record (which says it is current): a crash after it loses nothing.
    assert sorted(s["version"] for s in kept(daemon)) == [0, 1, 2] and kept_current(daemon)[0] == 2, kept(daemon)
    return {0: v0, 1: v1, 2: v2}


def assert_serves(daemon, written):
    with daemon.client(0) as client:
        for version, tensors in written.items():
            assert read_all(client, fingerprint(client, version)) == tensors, f"version {version} reads the bytes written"


def verify(daemon, version):
    """``weightd verify --name kv --version N``: its exit code and output."""
    r = subprocess.run(["node", str(MAIN_JS), "verify", "--name", NAME, "--version", str(version), "--weight-cache-socket-dir", daemon.socket_dir],
                       env={**os.environ, "WEIGHTD_HOST_DEVICES": daemon.device}, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def kept(daemon):
    """The shards the keeper holds (weightd keeper status --json)."""
    r = subprocess.run(["node", str(MAIN_JS), "keeper", "status", "--json", "--weight-cache-socket-dir", daemon.socket_dir], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["shards"]


def kept_current(daemon):
    """(version, since): the version whose kept records say it became current last, and when."""
    shards = [s for s in kept(daemon) if s["currentSince"] is not None]
    latest = max(shards, key=lambda s: (s["currentSince"], s["version"]), default=None)
    return (latest["version"], latest["currentSince"]) if latest else (None, 0)


def end(daemon, how):
    if how == "SIGTERM":
        daemon.stop()
    else:
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait(30)
        daemon.stop()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_written_versions_survive_a_restart_with_their_numbers_bytes_and_current_one(node, how):
    start, _ = node
    daemon = start()
    written = write_two_versions(daemon)
    assert versions(daemon) == {0: False, 1: False, 2: True}
    # The digests of the segments each shares with its base were the base's, reused: its memory digested now agrees.
    for version in (1, 2):
        code, out = verify(daemon, version)
        assert code == 0 and "no files: the daemon's memory digested against the digests its commit recorded" in out, out
    held = len(segment_inodes(daemon.proc.pid))
    with daemon.client(0) as client:
        reader = client.attach(fingerprint(client, 2), tensor_format="numpy")
    mapped = {inode for _, inode in segment_maps()}
    end(daemon, how)

    daemon = start()
    assert versions(daemon) == {0: False, 1: False, 2: True}, daemon.stderr
    assert_serves(daemon, written)
    for version in (1, 2):
        code, out = verify(daemon, version)
        assert code == 0 and f"all {len(written[version])} tensors of version {version} of model \"kv\"" in out, out
    code, out = verify(daemon, 0)
    assert code == 3 and "a checkpoint's version, which has files: verify it with --model" in out, out
    # The keeper's memory, not a copy: every segment once (each version shares all but one of its base's), and
    # the reader attached before the restart maps pages the new daemon serves.
    assert len(segment_inodes(daemon.proc.pid)) == held
    assert mapped <= {str(i) for i in segment_inodes(daemon.proc.pid)}
    assert {name: raw(view) for name, view in reader.tensors.items()} == written[2]
    reader.detach()
    # A commit after the restart numbers on.
    name = sorted(written[2])[0]
    with daemon.client(0) as client, client.begin_update(NAME, fingerprint(client, 2), tensors=[name]) as upd:
        upd.write(name, bytes((b + 3) % 256 for b in written[2][name]))
        assert upd.commit()["version"] == 3


def test_a_version_rolled_back_to_before_a_stop_is_current_after_it(node):
    start, _ = node
    daemon = start()
    written = write_two_versions(daemon)
    ctl(daemon, "rollback", NAME, "1")
    assert versions(daemon) == {0: False, 1: True, 2: False}
    # The rollback's reply comes once version 1's record says it is current.
    assert kept_current(daemon)[0] == 1
    since = kept_current(daemon)[1]
    daemon.stop()
    daemon = start()
    assert versions(daemon) == {0: False, 1: True, 2: False}
    assert_serves(daemon, written)
    # Twice: the restart keeps the current version's record anew, so the next one agrees whatever comes between.
    assert wait_for(lambda: kept_current(daemon) > (1, since) and kept_current(daemon)[0] == 1)
    daemon.stop()
    daemon = start()
    assert versions(daemon) == {0: False, 1: True, 2: False}


def test_a_changed_checkpoint_reloads_version_0_from_disk_and_the_written_versions_serve_on(node):
    start, model = node
    daemon = start()
    written = write_two_versions(daemon)
    daemon.stop()
    # The checkpoint's bytes change in place (same layout): its kept version 0 is stale.
    changed = os.path.join(model + ".changed")
    other_version(model, changed, 0x5A)
    for name in os.listdir(changed):
        if name.endswith(".safetensors"):
            with open(os.path.join(changed, name), "rb") as src, open(os.path.join(model, name), "r+b") as dst:
                dst.write(src.read())
    daemon = start()
    assert versions(daemon) == {0: False, 1: False, 2: True}
    with daemon.client(0) as client:
        v0 = read_all(client, fingerprint(client, 0))
    assert v0 != written[0] and all(v0[n] == bytes(b ^ 0x5A for b in written[0][n]) for n in v0), "version 0 is the files' bytes now"
    assert_serves(daemon, {1: written[1], 2: written[2]})
    assert "restored from the keeper" in daemon.stderr


def test_a_version_of_two_ranks_survives_a_crash_on_both(node):
    start, _ = node
    daemon = start(tp=2)
    clients = [daemon.client(rank) for rank in (0, 1)]
    try:
        before = [read_all(c, fingerprint(c, 0)) for c in clients]
        updates = [c.begin_update(NAME, fingerprint(c, 0)) for c in clients]
        try:
            for upd, old in zip(updates, before):
                name = sorted(old)[0]
                upd.write(name, bytes((b + 5) % 256 for b in old[name]))
            assert commit_all(updates)["version"] == 1
        finally:
            for upd in updates:
                upd.abandon()
        written = [read_all(c, fingerprint(c, 1)) for c in clients]
    finally:
        for c in clients:
            c.close()
    assert all(w != b for w, b in zip(written, before))
    assert wait_for(lambda: sorted(s["version"] for s in kept(daemon)) == [0, 0, 1, 1] and kept_current(daemon)[0] == 1)
    end(daemon, "SIGKILL")

    daemon = start(tp=2)
    assert versions(daemon) == {0: False, 1: True}
    for rank in (0, 1):
        with daemon.client(rank) as c:
            assert read_all(c, fingerprint(c, 1)) == written[rank], f"rank {rank} of version 1 reads the bytes written"
            assert read_all(c, fingerprint(c, 0)) == before[rank]



def keeper_pid(daemon):
    r = subprocess.run(["node", str(MAIN_JS), "keeper", "status", "--json", "--weight-cache-socket-dir", daemon.socket_dir], capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout)["pid"] if r.returncode == 0 else None


def test_a_keeper_restarted_mid_run_is_given_every_version_and_the_current_one(node):
    start, _ = node
    daemon = start()
    written = write_two_versions(daemon)
    ctl(daemon, "rollback", NAME, "1")
    assert kept_current(daemon)[0] == 1
    # The keeper dies; the daemon serves on and starts a fresh one, which holds nothing until the
    # daemon keeps every version there again: the written ones with what serving them needs, and
    # which one is current.
    old = keeper_pid(daemon)
    os.kill(old, signal.SIGKILL)
    assert wait_for(lambda: keeper_pid(daemon) not in (None, old))
    assert wait_for(lambda: sorted(s["version"] for s in kept(daemon)) == [0, 1, 2] and kept_current(daemon)[0] == 1), kept(daemon)
    end(daemon, "SIGKILL")

    daemon = start()
    assert versions(daemon) == {0: False, 1: True, 2: False}, daemon.stderr
    assert_serves(daemon, written)


class Paused:
    """The keeper stopped (SIGSTOP) while the block runs, and continued after it: a request to it waits
    (for less than the daemon's 5 s timeout of a keeper request) until then."""

    def __init__(self, daemon):
        self.pid = keeper_pid(daemon)

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def test_a_rollback_replies_only_once_the_keeper_holds_the_record_that_says_so(node):
    start, _ = node
    daemon = start()
    write_two_versions(daemon)
    with Paused(daemon):
        rollback = subprocess.Popen(["node", str(MAIN_JS), "ctl", "--weight-cache-socket-dir", daemon.socket_dir, "rollback", NAME, "1"],
                                    env={**os.environ, "WEIGHTD_HOST_DEVICES": daemon.device}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        assert rollback.poll() is None, "no reply while the keeper has not recorded it: " + "".join(rollback.communicate())
    out, err = rollback.communicate(timeout=60)
    assert rollback.returncode == 0, out + err
    # Its reply means the keeper's records say so: a crash right after it restarts on version 1.
    assert kept_current(daemon)[0] == 1
    end(daemon, "SIGKILL")
    daemon = start()
    assert versions(daemon) == {0: False, 1: True, 2: False}, daemon.stderr


def test_a_commit_replies_only_once_the_keeper_holds_the_new_version(node):
    start, _ = node
    daemon = start()
    with daemon.client(0) as client:
        base = fingerprint(client, 0)
        v0 = read_all(client, base)
        name = sorted(v0)[0]
        upd = client.begin_update(NAME, base, tensors=[name])
        upd.write(name, bytes((b + 1) % 256 for b in v0[name]))
        replies = []
        with Paused(daemon):
            committing = threading.Thread(target=lambda: replies.append(upd.commit()))
            committing.start()
            time.sleep(1.5)
            assert committing.is_alive() and replies == [], "no reply while the keeper does not hold the version"
        committing.join(60)
        assert replies and replies[0]["version"] == 1, replies
    assert sorted(s["version"] for s in kept(daemon)) == [0, 1] and kept_current(daemon)[0] == 1
    end(daemon, "SIGKILL")
    daemon = start()
    assert versions(daemon) == {0: False, 1: True}, daemon.stderr


def test_without_a_keeper_to_record_them_a_rollback_and_a_commit_are_refused_and_change_nothing(node):
    """An external keeper ends and none answers: a rollback or a commit, which no restart would find,
    is refused (E_VERSION_NOT_KEPT) and leaves the current version as it was; a keeper that answers
    again is given every version with the current one, which a restart then serves."""
    start, _ = node
    socket_dir = None
    keeper = None

    def start_keeper():
        proc = subprocess.Popen(["node", str(MAIN_JS), "keeper", "--weight-cache-socket-dir", socket_dir], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = type("D", (), {"socket_dir": socket_dir})
        assert wait_for(lambda: keeper_pid(probe) is not None)
        return proc

    # The fixture's socket directory, through a daemon of its own: the keeper must be up before the daemon with --keeper external.
    first = start()
    socket_dir = first.socket_dir
    first.stop()
    subprocess.run(["node", str(MAIN_JS), "keeper", "stop", "--weight-cache-socket-dir", socket_dir], capture_output=True, timeout=60)
    keeper = start_keeper()
    try:
        daemon = start(keeper="external")
        written = write_two_versions(daemon)
        keeper.kill()
        keeper.wait(30)
        assert wait_for(lambda: keeper_pid(daemon) is None)

        r = subprocess.run(["node", str(MAIN_JS), "ctl", "--weight-cache-socket-dir", daemon.socket_dir, "rollback", NAME, "1"],
                           env={**os.environ, "WEIGHTD_HOST_DEVICES": daemon.device}, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "E_VERSION_NOT_KEPT" in r.stderr and "version 2 stays current" in r.stderr, r.stdout + r.stderr
        assert versions(daemon) == {0: False, 1: False, 2: True}
        held = segment_inodes(daemon.proc.pid)
        with daemon.client(0) as client:
            name = sorted(written[2])[0]
            with client.begin_update(NAME, fingerprint(client, 2), tensors=[name]) as upd:
                upd.write(name, bytes((b + 7) % 256 for b in written[2][name]))
                with pytest.raises(ServeError) as refused:
                    upd.commit()
            assert refused.value.code == "E_VERSION_NOT_KEPT", refused.value
        assert wait_for(lambda: versions(daemon) == {0: False, 1: False, 2: True}), versions(daemon)
        # Nothing of the refused version is left: its copy of the written segment is freed.
        assert wait_for(lambda: segment_inodes(daemon.proc.pid) == held), (held, segment_inodes(daemon.proc.pid))

        keeper = start_keeper()
        assert wait_for(lambda: sorted(s["version"] for s in kept(daemon)) == [0, 1, 2] and kept_current(daemon)[0] == 2), kept(daemon)
        end(daemon, "SIGKILL")
        daemon = start(keeper="external")
        assert versions(daemon) == {0: False, 1: False, 2: True}, daemon.stderr
        assert_serves(daemon, written)
    finally:
        keeper.kill()
        keeper.wait(30)
