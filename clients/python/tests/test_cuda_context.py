"""The CUDA mapping against test/gpu/fake-libcuda.c (no GPU needed): it leaves the caller's
current context as it found it, and gives back every handle and context reference on every
path, success or failure. The fake reports what is left at exit (FAKE_CUDA_LEAKS)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_scenarios import FD_PATTERN
from test_host_fds import checkpoint_tensors

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = Path(__file__).with_name("cuda_scenarios.py")
NO_LEAKS = {"device": 0, "pinned": 0, "registered": 0, "imported": 0, "streams": 0, "events": 0, "contextRefs": 0, "vmm": 0, "reservations": 0, "mappings": 0, "vmmFds": 0, "modules": 0}


@pytest.fixture(scope="module")
def fake_env(tmp_path_factory):
    cc = shutil.which("cc")
    assert cc, "cc is needed to build the fake libcuda (apt-get install gcc)"
    out = tmp_path_factory.mktemp("fake-libcuda")
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out / "libcuda.so.1"), str(ROOT / "test/gpu/fake-libcuda.c"), "-lpthread"], check=True)
    return {**os.environ, "LD_LIBRARY_PATH": str(out), "FAKE_CUDA_REPORT": "1", "FAKE_CUDA_DEVICES": "2"}


def leaks(stderr):
    line = next((l for l in stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    assert line, f"the fake driver was not loaded: {stderr}"
    return json.loads(line[len("FAKE_CUDA_LEAKS ") :])


def exported(fake_env, how):
    # The fake refuses a process's own handles, as the real driver does: export from another one.
    exporter = subprocess.Popen([sys.executable, str(SCENARIOS), how], env=fake_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield exporter.stdout.readline().strip()
    finally:
        _, err = exporter.communicate("")
        assert exporter.returncode == 0, err
        assert leaks(err) == NO_LEAKS


@pytest.fixture(scope="module")
def handle(fake_env):
    yield from exported(fake_env, "export")


@pytest.fixture(scope="module")
def fd_path(fake_env):
    """/proc/PID/fd/N of an exporter's "cuda-fd" descriptor: opening it gives a descriptor of the same memory."""
    yield from exported(fake_env, "export_fd")


def scenario(fake_env, case, handle):
    r = subprocess.run([sys.executable, str(SCENARIOS), case, handle], env=fake_env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS, "a handle or context reference left behind"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_attach_and_close_restore_the_callers_context(fake_env, handle):
    got = scenario(fake_env, "restores", handle)
    assert got["bytesOk"], "read() copies from the segment while the caller's context is current"
    assert got["afterAttach"] == got["own"] and got["belowIt"] is None
    assert got["afterClose"] == got["own"]


def test_with_no_context_current_none_is_left_current(fake_env, handle):
    got = scenario(fake_env, "no_caller_context", handle)
    assert got["bytesOk"]
    assert (got["afterAttach"], got["afterClose"]) == (None, None)


@pytest.mark.parametrize("case, code", [("open_fails", "E_CUDA"), ("manifest_fails", "E_BAD_MANIFEST")])
def test_a_failed_attach_gives_everything_back(fake_env, handle, case, code):
    got = scenario(fake_env, case, handle)
    assert got["error"] == code
    assert got["afterAttach"] == got["own"]


def test_a_view_kept_past_close_keeps_its_handle_open_until_it_is_freed(fake_env, handle):
    # Closing an IPC pointer a tensor still uses would make its next use fault, and the fault
    # poisons the whole CUDA context: so the close (and the lease's end after it) waits.
    got = scenario(fake_env, "view_outlives_close", handle)
    assert (got["openWhileViewed"], got["endedWhileViewed"], got["bytesWhileViewed"]) == (1, False, True)
    assert (got["openAfter"], got["endedAfter"]) == (0, True)


def test_a_cuda_fd_segment_is_imported_mapped_read_and_given_back_restoring_the_callers_context(fake_env, fd_path):
    got = scenario(fake_env, "fd_restores", fd_path)
    assert got["bytesOk"], "read() copies from the imported VMM mapping, after the fd itself was closed"
    assert got["afterAttach"] == got["own"]
    assert got["afterClose"] == got["own"]


def test_a_write_into_a_read_only_cuda_fd_mapping_faults_in_the_writer_and_changes_nothing(fake_env, fd_path):
    r = subprocess.run([sys.executable, str(SCENARIOS), "fd_write", fd_path], env=fake_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"readOnly": True}]
    with open(fd_path, "rb") as f:
        assert f.read(len(FD_PATTERN)) == FD_PATTERN, "the exporter's bytes are unchanged"


def test_a_driver_refusing_read_only_mappings_maps_read_write_and_says_so(fake_env, fd_path):
    r = subprocess.run([sys.executable, str(SCENARIOS), "fd_write", fd_path], env={**fake_env, "FAKE_CUDA_NO_READ_ONLY": "1"}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0]) == {"readOnly": False}
    assert "refuses read-only device mappings" in r.stderr
    assert leaks(r.stderr) == NO_LEAKS


def test_a_cuda_fd_segment_that_cannot_be_mapped_gives_back_its_import_and_range(fake_env, fd_path):
    got = scenario(fake_env, "fd_map_fails", fd_path)
    assert got["error"] == "E_CUDA" and "cuMemMap(segment 0, 4194304 bytes)" in got["message"]
    assert got["afterAttach"] == got["own"]


def test_a_cuda_fd_segment_without_its_descriptor_names_get_segment_fds(fake_env, fd_path):
    got = scenario(fake_env, "fd_missing", fd_path)
    assert got["error"] == "E_NO_SEGMENT_FDS" and "get_segment_fds" in got["message"]
    assert got["afterAttach"] == got["own"]


def test_a_daemon_with_cuda_handles_fd_is_copied_and_attached_through_get_segment_fds_leaving_nothing(fake_env):
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_fd"], env=fake_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS, "the client left a mapping, an import or a descriptor behind"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["handles"] == ["cuda-fd"]
    assert got["copyOk"] and got["attachOk"], "every tensor equals the checkpoint's bytes"
    # One segment (tp=1): the fake driver's reference to the import, and none of the received descriptors.
    assert got["fdsWhileAttached"] == ["/memfd:fakecuda-vmm-d0"], "the descriptors are closed once mapped: the mappings hold the memory"
    assert got["fdsAfter"]
    assert got["daemonLeaks"] == NO_LEAKS


def test_a_cuda_writer_writes_staging_that_is_copied_into_memory_no_writer_maps_and_a_killed_one_leaves_nothing(fake_env, tmp_path):
    log = tmp_path / "access.log"
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_update"], env={**fake_env, "FAKE_CUDA_ACCESS_LOG": str(log)}, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS, "the writer or the reader left a mapping, an import or a descriptor behind"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["fullSegments"] > 2, "the plan file cuts the arena into several segments"
    # The reader's bytes change only at switch_to, at the same addresses.
    assert got["readerKeepsBaseWhileWriting"] and got["readerKeepsBaseAfterCommit"]
    assert got["fullVersion"] == 1 and got["fullAfterSwitch"]
    assert got["fullFingerprint"] == got["hostFingerprint"], "the digests of what was written, hashed from the GPU, are the host backend's of the same bytes"
    # A partial update writes one tensor's segment; every other tensor keeps the earlier bytes.
    assert got["partialCopied"] == 1 and got["notNamedRefused"] == "E_NOT_NAMED"
    assert got["viewAliveRefused"] == "E_UPDATE_MAPPED", "commit unmaps first, so a live view of the staging refuses it"
    assert got["partialKeepsFullBeforeSwitch"] and got["partialAfterSwitch"]
    # The partial commit read only its written segment's tensors (the rest took the base's
    # digests), and made the host's version of the same bytes (docs/spec/fingerprint.md §9).
    assert got["sealedRead"] == [got["tensorCount"], got["partialSegmentTensors"]] and got["partialSegmentTensors"] < got["tensorCount"]
    assert got["partialFingerprint"] == got["hostPartialFingerprint"]
    assert got["versions"] == [0, 1, 2]
    # The daemon's side of an update is its staging descriptors; a killed writer's are all closed
    # (a leak would show as the next update's count plus the killed one's).
    assert got["writerBegun"] == "begun"
    assert got["daemonHeldWhileWriting"] == got["fullSegments"] == got["daemonHeldByNextUpdate"]
    assert got["daemonLeaks"] == NO_LEAKS, "no allocation, mapping or descriptor of an update outlives it"
    # Who could write what (the fake's record of cuMemSetAccess, by allocation): nothing a reader
    # maps was ever mapped writable outside the daemon, and no writer's staging is ever served.
    rows = [line.split() for line in log.read_text().splitlines()]
    client, writer, daemon = str(got["clientPid"]), str(got["writerPid"]), str(got["daemonPid"])
    served = {ino for pid, ino, flags in rows if pid == client and flags == "1"}
    staging = {ino for pid, ino, flags in rows if pid in (client, writer) and flags == "3"}
    assert staging and not staging & served, "a reader mapped memory a writer mapped writable"
    assert {pid for pid, ino, flags in rows if ino in served and flags == "3"} == {daemon}
    n = got["fullSegments"]
    assert len(served) == n + n + 1, "the base, the full update's finals, and the partial update's one new segment: the rest is shared"


def test_a_pull_finds_each_allocation_once_and_names_every_tensor_by_its_handle_and_offset(fake_env):
    r = subprocess.run([sys.executable, str(SCENARIOS), "pull_locate"], env=fake_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # TrainerMemory packs its tensors at 256-byte steps after 512 bytes: a at 512, b at 1536, c at 4608.
    assert got["located"] == {"a": [0, 512, 1000], "b": [0, 1536, 3000], "c": [0, 4608, 256], "d": [1, 512, 512]}, got
    assert got["handles"] == 2
    # One driver lookup per allocation, not per tensor: the others lie in one already found.
    assert got["rangeCalls"] == 2, got
    assert got["past"] == "E_BAD_SIZE" and got["rangeCallsAfter"] == 2, got


@pytest.mark.parametrize("hashing", ["cpu", "kernel", "hash-only kernel"])
def test_a_pull_copies_the_writers_own_device_memory_once_into_memory_no_writer_maps_and_refuses_what_does_not_fit(fake_env, tmp_path, hashing):
    log = tmp_path / "access.log"
    env = {**fake_env, "FAKE_CUDA_ACCESS_LOG": str(log)}
    if hashing != "cpu":
        # The fake runs the digest kernel on the CPU when its stream is waited for: a pull's
        # per-segment launch that ran before its segment's copies would hash the fake's 0xEE bytes,
        # and the pulled version's digests would differ from the staged one's (stagedSameVersion).
        # "hash-only": a kernel file built before the copying kernel existed.
        kernel = tmp_path / "digest-kernel.fake"
        kernel.write_text("any image: the fake driver loads it as the digest kernel\n")
        env.update(FAKE_CUDA_KERNELS="hash-only" if hashing == "hash-only kernel" else "1", WEIGHTD_DIGEST_KERNEL=str(kernel))
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_pull"], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS, "the writer or the reader left a mapping, an allocation or a descriptor behind"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # No staging: nothing comes with the update, and the daemon makes nothing until tensors are named.
    assert got["pullHandedSegments"] == 0 and got["pullNoStaging"] == "E_BAD_OPTION"
    assert got["daemonMadeWhilePulling"] == 0, "the daemon holds only its own references to the base's allocations"
    # Named, their segments' finals are made and written off the commit's path, and the commit
    # serves those very allocations (it makes none of its own).
    assert got["daemonMadeAfterPull"][0] == got["daemonMadeAfterPull"][1] > 0, got["daemonMadeAfterPull"]
    assert got["servesEarlyFinals"], "the version serves the finals made at pull time"
    assert got["threadsAddedByCommit"] == 0, "the committed version's rank adopts on the main thread, with no worker thread of its own"
    assert got["pulledReply"][0] == got["pulledReply"][1] > 2 and got["pullAgain"] == "E_BAD_OPTION"
    # The reader's bytes change only at switch_to, at the same addresses; the writer's memory is
    # freed right after the commit and the version keeps its bytes (the daemon's own copy).
    assert got["readerKeepsBaseWhilePulling"] and got["readerKeepsBaseAfterCommit"]
    assert got["fullVersion"] == 1 and got["fullAfterSwitch"]
    # The same bytes through staging are the same content: the pull's digests are those bytes'.
    assert got["stagedSameVersion"] == [1, True]
    assert got["partialVersion"] == 2 and got["partialAfterSwitch"]
    # Each pull's commit hashed only what it pulled (the rest is the base's, by its digests).
    assert got["sealed"][0]["read"] == got["pulledReply"][1] and got["sealed"][0]["pulled"] == got["pulledReply"][1]
    assert got["sealed"][2] == {"read": 1, "pulled": 1}, "a one-tensor pull hashes one tensor, even with others in its segment"
    assert got["partialSegmentTensors"] > 1
    # The pulled tensors (none shares bytes with another here) are digested as they are copied,
    # and the bytes no tensor holds are written as zeros then: a full pull's commit maps nothing,
    # and a one-tensor pull's maps only its final and the base's segment, for the other tensors there.
    assert got["sealedAtPull"][0] == [got["pulledReply"][1], 0], got["sealedAtPull"]
    assert got["sealedAtPull"][2] == [1, 2], got["sealedAtPull"]
    assert got["sealedAtPull"][1] == [None, got["daemonMadeAfterPull"][1] * 2], "the staging path maps each staging allocation and its final"
    assert set(got["hashedOn"]) == {"cpu" if hashing == "cpu" else "gpu"}, got["hashedOn"]
    # Where each commit's time went, in the daemon's log (update_cuda.py reads it on a GPU).
    split = ["allocateMs", "copyMs", "digestMs", "mapMs", "mapped", "nativeMs", "openMs", "planMs", "queueMs", "waitPullsMs"]
    assert got["sealedTimings"][1] == split, got["sealedTimings"]
    assert all(t == sorted(split + ["pullTimings"]) for i, t in enumerate(got["sealedTimings"]) if i != 1), got["sealedTimings"]
    assert all(t == ["allocateMs", "copiedByKernelBytes", "copyMs", "digestMs", "mapMs", "moduleMs", "nativeMs", "openMs", "queueMs", "releaseMs", "setupMs"] for i, t in enumerate(got["pullTimings"]) if i != 1), got["pullTimings"]
    # With the kernel, it makes the copies of the pieces it hashes, reading them once: every byte of
    # the full pull (each tensor lies whole in one copy, word-aligned on both sides), none of the
    # one-tensor pull (its source is 4 bytes off a word: the driver copies it, and its bytes and
    # digest are still right, partialAfterSwitch). Hashed on the CPU, or by a kernel file with no
    # copying kernel, every copy is the driver's.
    assert got["copiedByKernel"] == ([got["pulledBytes"][0], None, 0] if hashing == "kernel" else [0, None, 0]), (got["copiedByKernel"], got["pulledBytes"])
    assert all({"commitMs", "publishMs"} <= set(t) for t in got["committedTimings"]), got["committedTimings"]
    # Refused before anything is copied: on the client, and by the daemon for a writer that skips it.
    assert [got["clientBadSize"], got["clientUnknown"]] == ["E_BAD_SIZE", "E_UNKNOWN_TENSOR"]
    assert [got["daemonUnknown"], got["daemonBadSize"], got["daemonBadSource"], got["daemonTwice"], got["daemonEmptyCommit"]] == [
        "E_UNKNOWN_TENSOR", "E_UPDATE_SIZE", "E_BAD_REQUEST", "E_BAD_REQUEST", "E_BAD_REQUEST"]
    assert got["daemonPastAllocation"] == "E_UPDATE_SIZE", "a copy past the end of the writer's allocation"
    assert got["stagingPullRefused"] == "E_BAD_REQUEST" and got["wrongDevice"] == "E_DEVICE_MISMATCH" and got["pullWithTensors"] == "E_BAD_REQUEST"
    assert got["goneSource"] == "E_UPDATE_SOURCE" and "cuIpcOpenMemHandle" in got["goneMessage"], got.get("goneMessage")
    assert "ended with it: begin_update again" in got["goneMessage"], got["goneMessage"]
    assert got["beginAfterFailedPull"] == "begun", "a failed pull ends its update: the model is not left busy"
    # A writer killed after pulling: its update ends with its connection, nothing held or served.
    # (It held one final more than the next pull: its tensor's segment, made as it pulled.)
    assert got["writerPulled"] == "pulled" and got["heldByKilledWriter"] == got["heldByNextPull"] + 1 and got["heldByNextPull"] > 0
    assert got["versions"] == [0, 1, 2]
    assert got["daemonLeaks"] == NO_LEAKS, "every IPC handle of a writer's memory is closed, every final of a refused commit freed"
    # Who could write what: no allocation a reader maps was ever mapped writable outside the daemon.
    rows = [line.split() for line in log.read_text().splitlines()]
    served = {ino for pid, ino, flags in rows if pid == str(got["clientPid"]) and flags == "1"}
    assert served and {pid for pid, ino, flags in rows if ino in served and flags == "3"} == {str(got["daemonPid"])}


def test_a_prepared_pull_makes_its_finals_at_begin_copies_straight_into_them_and_frees_what_no_pull_wrote(fake_env):
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_pull_prepared"], env=fake_env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # Made at begin, before any tensor is named, and served as they are: the commit made none.
    assert got["madeBeforePull"][0] == got["madeBeforePull"][1] > 1, got["madeBeforePull"]
    assert got["fullServesPrepared"] and got["fullReads"]
    assert got["stagedSame"] == [1, 1, True], "the same bytes staged are the same version: the prepared pull's digests are its bytes'"
    assert got["partialMadeBeforePull"] == 1 and got["partialReads"] and got["partialNew"] == 1
    # Every segment prepared, one pulled: the version holds one final, the others are freed.
    assert got["thirdVersion"] == 3 and got["thirdNew"] == 1, got
    assert got["abandonedMade"] == got["madeBeforePull"][1] and got["abandonedLeft"] == 0
    assert got["pullUpdate"] == 4
    assert [got["clientStagingPrepare"], got["clientListNoPrepare"]] == ["E_BAD_OPTION", "E_BAD_OPTION"]
    assert [got["daemonStagingPrepare"], got["daemonUnknown"]] == ["E_BAD_REQUEST", "E_UNKNOWN_TENSOR"]
    # The pulls' native calls neither made nor mapped a final: each copied into the prepared ones.
    assert got["pullMade"] == [[0, 0]] * 4, got["pullMade"]
    assert got["prepareMs"] == [True] * 4
    # The log says how many finals each pull's begin prepared (the abandoned one's too).
    segments = got["madeBeforePull"][1]
    assert got["begunPrepared"] == [segments, 1, segments, segments, 1], got["begunPrepared"]
    assert got["daemonLeaks"] == NO_LEAKS, "every prepared final unmapped and freed, the abandoned update's too"


def test_a_prepared_pull_that_does_not_fit_the_gpu_is_refused_by_name_and_leaves_nothing(fake_env):
    # A fake GPU of 24 MiB holding the arena in 1 MiB segments (16 MiB, whole granules): a second
    # version's finals do not fit, one segment's staging copy does.
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_pull_prepare_refused"], env={**fake_env, "FAKE_CUDA_MEM_MB": "24"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["begun"] is None, "begin replies before the finals are made"
    assert got["refused"] == "E_OUT_OF_MEMORY", got
    assert re.search(r"preparing the pull's \d+ final segment\(s\) needs \d+ bytes on GPU 0 but only \d+ bytes are free", got["message"]), got["message"]
    assert "begin_update again" in got["message"], got["message"]
    assert got["heldAfter"] == 0 and got["next"] == 1 and got["daemonLeaks"] == NO_LEAKS, got


def test_written_versions_keep_the_gpus_context_made_once_the_checkpoints_version_drained(fake_env, tmp_path):
    # A served version's device holds the primary context; with none holding it, every update
    # call made and destroyed it again (~100 ms each on a GPU: an 8 GB pull took 400 ms, not 30).
    made = tmp_path / "made.log"
    made.write_text("")
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_pull_context", str(made)], env={**fake_env, "FAKE_CUDA_MADE_LOG": str(made)}, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["versions"] == [1, 2, 3, 4] and 0 not in got["serving"], got
    assert got["madeBefore"] >= 1 and got["madeAfter"] == got["madeBefore"], got


def test_a_pull_answers_before_the_daemon_lets_go_of_the_writers_memory_and_leaves_nothing(fake_env, tmp_path):
    # Letting go of what a pull held (the writer's memory opened, the finals' mappings, the digest
    # kernel's module, the streams) took ~0.6 ms of an 8 GB pull before its answer on an H100; the
    # addon's releaser thread does it after. Here the daemon's close of the writer's memory waits
    # at a gate the test opens only once the commit answered.
    gate = tmp_path / "ipc-close.gate"
    os.mkfifo(gate)
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_pull_releases_later", str(gate)], env=fake_env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["committedWhileCloseHeld"], f"the commit waited for the close of the writer's memory: {got}"
    assert got["error"] is None and got["version"] == 1 and got["reads"], got
    assert got["daemonLeaks"] == NO_LEAKS, f"the releaser closed the writer's memory once the gate opened: {got}"


def test_a_writer_and_a_switch_on_legacy_cuda_ipc_handles_are_refused_naming_the_flag(fake_env):
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_ipc_update"], env=fake_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["refused"] == "E_UPDATE_UNSUPPORTED" and "--cuda-handles fd" in got["message"], got
    assert got["switchRefused"] == "E_REMAP_UNSUPPORTED" and "--cuda-handles fd" in got["switchMessage"], got
    assert got["leasesOnOther"] == 0, "the refused switch's lease is given back"


def test_switch_to_puts_another_version_behind_the_same_pointers_and_back_leaving_nothing(fake_env):
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_switch"], env=fake_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS, "the switches left a mapping, an import or a descriptor behind"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["versionsDiffer"] and got["before"]
    assert got["switched"] and got["afterSwitch"], "after switch_to every view reads the new version's bytes"
    assert got["samePointers"], "at the same addresses"
    assert got["leases"] == [0, 1] and got["leaseChanged"], "the new version's lease replaces the old one"
    assert got["afterSwitchBack"]
    assert got["unservedIsMismatch"]
    assert got["badFdRefused"], "a descriptor that does not import changes nothing"
    assert got["ctlLoad"] == 0 and got["heardReady"], "a hot swap under the watched name announces the new version"
    assert got["followedUpdate"], "switch_to the announced fingerprint: the same pointers read the update"
    assert got["leasesHeld"] == 1 and got["leasesAfter"] == [], "detach ends the lease on the version switched to last"
    assert (got["leasesWhileAViewLives"], got["leasesOnceFreed"]) == (2, 1), "a detached attach's lease ends once its last view is freed"
    assert got["daemonLeaks"] == NO_LEAKS


def test_switch_to_remaps_only_the_segments_the_new_version_does_not_share_and_a_prepared_switch_only_remaps(fake_env):
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_switch_shared"], env=fake_env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS, "a switch, or a prepared one dropped by detach, left an import or a mapping behind"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    n = got["segments"]
    assert n > 2 and got["memoryNamed"], "get_state names each cuda-fd segment's memory"

    def remap_calls(k, imports=None):
        # k segments remapped: one import, unmap and map each, and one read-only access for each
        # run of neighbours (here the k are one run); the replaced allocations are released
        # after switch_to returned, by the client's retirer thread (retired_calls).
        calls = {"cuMemImportFromShareableHandle": k if imports is None else imports, "cuCtxSynchronize": 1, "cuMemUnmap": k, "cuMemMap": k, "cuMemSetAccess": 1}
        return {c: v for c, v in calls.items() if v}

    def retired_calls(k):
        return {"cuMemRelease": k} if k else {}

    assert got["attachCalls"]["cuMemSetAccess"] == 1 and got["attachCalls"]["cuMemMap"] == n, "attach maps every segment side by side and gives access once"

    assert got["full"] == {"calls": remap_calls(n), "retired": retired_calls(n), "fds": n, "did": {"remapped": list(range(n)), "skipped": 0}, "leasesOfOld": [1, 0]} and got["fullReads"], \
        "a full switch: the old allocations are released and the old lease dropped after switch_to returned, not before"
    one = got["oneSegment"]
    assert got["partial"] == {"calls": remap_calls(1), "retired": retired_calls(1), "fds": 1, "did": {"remapped": [one], "skipped": n - 1}}, "one segment written: one descriptor, one import, one remap"
    assert got["partialReads"], "every view reads the partial update's bytes at its old address"
    assert got["leases"] == [0, 1], "the old version's lease is dropped, the new one's held"
    assert got["prepareCalls"] == {"cuMemImportFromShareableHandle": 1} and got["readsV2WhilePrepared"], "prepare_switch imports only, and the views still read the mapped version"
    assert got["leasesWhilePrepared"] == [1, 1]
    assert got["prepared"]["calls"] == remap_calls(1, imports=0) and got["prepared"]["retired"] == retired_calls(1), "the switch after a prepare imports nothing"
    assert got["prepared"]["fds"] == 0 and got["prepared"]["did"]["skipped"] == n - 1
    assert got["preparedReads"]
    assert got["cuMemMapFailed"] == ["E_CUDA", True, True, [0, 1]], "a map failing midway: every segment back, the old lease kept, the new one dropped"
    two = sorted([one, got["prepared"]["did"]["remapped"][0]])
    assert got["twoRuns"]["did"] == {"remapped": two, "skipped": n - 2} and got["twoRuns"]["calls"]["cuMemSetAccess"] == (1 if two[1] == two[0] + 1 else 2), "one access call per run of neighbouring segments"
    assert got["twoRunsReads"]
    assert got["back"]["did"]["skipped"] == n - 1 and got["back"]["fds"] == 1 and got["backReads"], "back to a retained version: only the segment that differs"
    assert got["same"] == {"calls": {}, "retired": {}, "fds": 0, "did": {"remapped": [], "skipped": n}}, "switching to the version mapped touches nothing"
    assert got["unnamedChanged"] == list(range(n)), "segments whose memory is not named are remapped, as before names"
    assert got["unknownSegmentRefused"] == "E_BAD_REQUEST"
    assert got["leasesAfter"] == [0, 0], "detach ends the mapped version's lease and the prepared one's"
    assert got["closeReleased"] == ["MainThread"], "a mapping closed before its retirer ran releases what the switch replaced itself, once"
    assert got["leasesAfterLate"] == [0, 0], "and the detach after it waits for the retirer to drop the old lease"
    assert got["daemonLeaks"] == NO_LEAKS


def test_an_update_that_does_not_fit_the_gpu_is_refused_before_allocating_naming_the_bytes(fake_env):
    # A fake GPU of 16 MiB holding a 10 MiB arena: a second copy does not fit.
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_update_refused"], env={**fake_env, "FAKE_CUDA_MEM_MB": "16"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["refused"] == "E_OUT_OF_MEMORY", got
    assert re.search(r"needs \d+ bytes on GPU 0 but only \d+ bytes are free", got["message"]), got["message"]
    assert got["heldAfter"] == 0 and got["daemonLeaks"] == NO_LEAKS


def test_an_allocation_failing_midway_through_begin_gives_back_every_staging_copy_made(fake_env):
    # Seven segments of ~1 MiB (2 MiB allocations): the base takes cuMemCreate 1-7, the 10th is the third staging copy.
    env = {**fake_env, "FAKE_CUDA_VMM_FAIL": "cuMemCreate:10"}
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_update_refused", str(1 << 20)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["refused"] == "E_OUT_OF_MEMORY" and "cuMemCreate failed" in got["message"], got
    assert got["heldAfter"] == 0 and got["daemonLeaks"] == NO_LEAKS


def test_a_processed_layout_is_published_beside_a_cuda_version_and_mapped_back_read_only_leaving_nothing(fake_env):
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_publish"], env=fake_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS, "the publish left a mapping, an import or a descriptor behind in the client"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["published"] and got["found"]
    assert got["sameBytes"], "the mapped layout reads the bytes the engine wrote"
    assert got["readOnly"], "a reader maps the final allocation read-only"
    assert got["again"] == "E_PUBLISHED"
    assert got["daemonLeaks"] == NO_LEAKS


@pytest.mark.parametrize("hashing", ["gpu", "cpu"])
def test_a_pull_plan_names_the_trainers_tensors_once_and_every_update_after_pulls_them_by_one_request(fake_env, tmp_path, hashing):
    env = dict(fake_env)
    if hashing == "gpu":
        kernel = tmp_path / "digest-kernel.fake"
        kernel.write_text("any image: the fake driver loads it as the digest kernel\n")
        env.update(FAKE_CUDA_KERNELS="1", WEIGHTD_DIGEST_KERNEL=str(kernel))
    r = subprocess.run([sys.executable, str(SCENARIOS), "daemon_pull_plan"], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert leaks(r.stderr) == NO_LEAKS, "the trainer or the reader left a mapping, an allocation or a descriptor behind"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["planReply"][:2] == [sum(1 for v in checkpoint_tensors().values() if v), 1] and got["planReply"][2] == ["moduleMs", "nativeMs", "openMs", "setupMs"], got["planReply"]
    # Three updates by one plan, the second prepared: each version serves that step's bytes at the reader's addresses.
    assert got["steps"] == [[1, True, True, True], [2, True, True, True], [3, True, True, True]], got["steps"]
    assert got["stagedSame"], "the plan's digests are those of the bytes it pulled"
    # The updates opened no memory and set up no kernel: the plan did, once. A full pull by plan
    # leaves its commit nothing to copy, map or hash: no native call.
    assert got["planPullSetup"] == [[0, 0]] * 3, got["planPullSetup"]
    assert got["planCommitNative"] == [0, 0, 0], got["planCommitNative"]
    assert [got["pulledTwice"], got["daemonPulledTwice"], got["daemonUnknownPlan"], got["foreignPlan"]] == ["E_BAD_OPTION", "E_BAD_REQUEST", "E_NO_PULL_PLAN", "E_NO_PULL_PLAN"], got
    assert got["moved"] == "E_PULL_PLAN_STALE"
    assert got["fifthPlan"] == "E_TOO_MANY_PULL_PLANS"
    assert [got["badName"], got["badSize"], got["badDevice"], got["unknownModel"]] == ["E_UNKNOWN_TENSOR", "E_UPDATE_SIZE", "E_DEVICE_MISMATCH", "E_UNKNOWN_MODEL"], got
    assert got["closedConnectionPlan"] == "E_NO_PULL_PLAN", "a plan ends with the connection that opened it"
    assert got["closedPlan"] == "E_PULL_PLAN_CLOSED"
    # A plan in parts: the client sent several, and the plan serves as one sent whole.
    tensors = sum(1 for v in checkpoint_tensors().values() if v)
    assert got["partedReply"] == [tensors, False, True, tensors], got["partedReply"]
    assert got["parted"] == [True, True], got["parted"]
    assert got["partPending"] == [True, 1, False] and got["partMade"] == [True, 2, True], got
    assert [got["partOtherConnection"], got["partTwice"], got["partAfterMade"]] == ["E_NO_PULL_PLAN", "E_BAD_REQUEST", "E_NO_PULL_PLAN"], got
    # The main plan, the moved one, the four on one connection, and the two made in parts.
    assert got["plansOpened"] == 8
    assert got["daemonLeaks"] == NO_LEAKS, "every plan's opened memory, kernel buffers and streams let go of"
