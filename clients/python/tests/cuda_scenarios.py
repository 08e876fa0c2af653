"""Scenarios of the CUDA mapping against test/gpu/fake-libcuda.c, each in its own process (the
fake is found through LD_LIBRARY_PATH; its leak report is on stderr at exit):

  cuda_scenarios.py export               allocate 4 KiB on fake device 0, fill it, print its IPC
                                         handle (base64); free it when stdin closes
  cuda_scenarios.py export_fd            the same as VMM memory (2 MiB) exported as a descriptor;
                                         prints /proc/PID/fd/N, which reopens the fake's memfd in
                                         another process as a descriptor received over a socket would
  cuda_scenarios.py daemon_fd            a daemon on the fake GPU with --cuda-handles fd: copy and
                                         attach through get_segment_fds, compare with the checkpoint
  cuda_scenarios.py daemon_switch        a daemon on the fake GPU with --cuda-handles fd serving two
                                         versions of one checkpoint: switch_to() one and back in place
  cuda_scenarios.py daemon_update        a writer on the fake GPU (--cuda-handles fd, segments of
                                         about 1 MiB): a full update, a partial one, a writer killed
                                         mid-update; FAKE_CUDA_ACCESS_LOG records who mapped what writable
  cuda_scenarios.py update_writer SOCKET MODEL BASE
                                         begin an update, map its staging, print "begun" and wait to be killed
  cuda_scenarios.py daemon_pull          a writer that pulls (source "pull") from its own device memory on the
                                         fake GPU: full, partial, the refusals, a killed writer; the
                                         writer's memory freed after commit; FAKE_CUDA_ACCESS_LOG as above
  cuda_scenarios.py pull_locate          where a pull names tensors of two allocations of its own, with
                                         how many driver lookups it made, and a view past an allocation
  cuda_scenarios.py daemon_pull_plan     pull plans: a trainer's tensors named once, pulled by plan in three
                                         updates; the refusals; nothing left once the plans close
  cuda_scenarios.py pull_by_foreign_plan SOCKET MODEL BASE PLAN
                                         begin a pull and name another process's plan; print the code
  cuda_scenarios.py pull_writer SOCKET MODEL BASE
                                         begin a pull, pull one tensor from its own memory, print "pulled"
                                         and wait to be killed
  cuda_scenarios.py daemon_ipc_update    a daemon with --cuda-handles ipc refuses a writer, naming the flag
  cuda_scenarios.py daemon_update_refused [SEGMENT_BYTES]
                                         begin_update where the fake refuses (the test sets
                                         FAKE_CUDA_MEM_MB or FAKE_CUDA_VMM_FAIL): its error, and
                                         what the daemon holds after it
  cuda_scenarios.py CASE HANDLE          attach to the exported segment, print one JSON line
"""

import base64
import ctypes
import json
import os
import sys

SIZE = 4096
PATTERN = bytes(i % 251 for i in range(SIZE))
# fake-libcuda's UUID of device d: bytes 0x10*d + i.
DEVICE0 = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
E_INVALID_CONTEXT = 201
FD_SIZE = 2 << 20
FD_PATTERN = bytes(i % 251 for i in range(FD_SIZE))


def export() -> None:
    lib = ctypes.CDLL("libcuda.so.1")
    ctx, ptr, handle = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.create_string_buffer(64)
    assert lib.cuInit(0) == 0 and lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert lib.cuCtxPushCurrent_v2(ctx) == 0 and lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(SIZE)) == 0
    ctypes.memmove(ptr.value, PATTERN, SIZE)  # the fake's device memory is this process's mapping
    assert lib.cuIpcGetMemHandle(handle, ptr) == 0
    print(base64.b64encode(handle.raw).decode(), flush=True)
    sys.stdin.read()
    assert lib.cuMemFree_v2(ptr) == 0 and lib.cuCtxPopCurrent_v2(None) == 0 and lib.cuDevicePrimaryCtxRelease_v2(0) == 0


def export_fd() -> None:
    from weightd_client.cuda import _AccessDesc, _AllocProp, _MemLocation

    lib = ctypes.CDLL("libcuda.so.1")
    u64 = ctypes.c_uint64
    ctx, handle, ptr, fd = ctypes.c_void_p(), u64(), u64(), ctypes.c_int(-1)
    prop = _AllocProp(type=1, requestedHandleTypes=1, location=_MemLocation(1, 0))
    access = _AccessDesc(location=_MemLocation(1, 0), flags=3)
    size = ctypes.c_size_t(FD_SIZE)
    assert lib.cuInit(0) == 0 and lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and lib.cuCtxPushCurrent_v2(ctx) == 0
    assert lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), ctypes.c_ulonglong(0)) == 0
    assert lib.cuMemAddressReserve(ctypes.byref(ptr), size, size, u64(0), ctypes.c_ulonglong(0)) == 0
    assert lib.cuMemMap(ptr, size, ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0)) == 0
    assert lib.cuMemSetAccess(ptr, size, ctypes.byref(access), ctypes.c_size_t(1)) == 0
    ctypes.memmove(ptr.value, FD_PATTERN, FD_SIZE)  # the fake's device memory is this process's mapping
    assert lib.cuMemExportToShareableHandle(ctypes.byref(fd), handle, 1, ctypes.c_ulonglong(0)) == 0
    print(f"/proc/{os.getpid()}/fd/{fd.value}", flush=True)
    sys.stdin.read()
    os.close(fd.value)
    assert lib.cuMemUnmap(ptr, size) == 0 and lib.cuMemAddressFree(ptr, size) == 0 and lib.cuMemRelease(handle) == 0
    assert lib.cuCtxPopCurrent_v2(None) == 0 and lib.cuDevicePrimaryCtxRelease_v2(0) == 0


def fd_state(nbytes: int = FD_SIZE) -> dict:
    return {
        "device": {"uuid": DEVICE0},
        "rank": {"globalRank": 0},
        "segments": [{"segment": 0, "handle": "cuda-fd", "bytes": nbytes}],
        "tensors": [{"name": "w", "dtype": "U8", "shape": [FD_SIZE], "segment": 0, "offset": 0, "bytes": FD_SIZE}],
        "aliases": {},
    }


def daemon_fd() -> None:
    from daemon_fixture import Daemon
    from test_host_fds import MODEL, checkpoint_tensors, open_fds
    from weightd_client import expected_fingerprint

    want, e, out = checkpoint_tensors(), expected_fingerprint(MODEL, 1, 0), {}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd"]) as daemon:
        with daemon.client() as client:
            client.ping()  # the connection is open before the count
            before = open_fds()
            copied = client.copy(e.fingerprint, e.fields, device=0, tensor_format="memoryview")
            out["copyOk"] = all(bytes(copied[n]) == want[n] for n in want)
            attached = client.attach(e.fingerprint, e.fields, device=0, tensor_format="memoryview")
            out["handles"] = sorted({s["handle"] for s in attached.state["segments"]})
            # The fake's device memory is host memory: the views read directly.
            out["attachOk"] = all(ctypes.string_at(attached.tensors[n].pointer, len(want[n])) == want[n] for n in want)
            # What this process opened meanwhile: the fake driver keeps a descriptor of each import
            # (its own reference, as close() of the received one must not free the memory).
            out["fdsWhileAttached"] = sorted(t.split(" ")[0].rsplit("-", 1)[0] for fd, t in open_fds().items() if before.get(fd) != t)
            attached.tensors = {}
            attached.detach()
            out["fdsAfter"] = open_fds() == before
        daemon.stop()
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    print(json.dumps(out))


def daemon_switch() -> None:
    import tempfile

    import subprocess

    from daemon_fixture import MAIN_JS, Daemon
    from test_host_fds import MODEL, checkpoint_tensors
    from versions import other_version
    from weightd_client import expected_fingerprint
    from weightd_client.cuda import CudaError

    work = tempfile.mkdtemp(prefix="weightd-switch-")
    v1 = os.path.join(work, "v1")
    other_version(MODEL, v1)
    want0, want1 = checkpoint_tensors(), checkpoint_tensors(v1)
    e0, e1 = expected_fingerprint(MODEL, 1, 0), expected_fingerprint(v1, 1, 0)
    out = {"versionsDiffer": all(want0[n] != want1[n] for n in want0 if want0[n])}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--model", v1, "-tp", "1"]) as daemon:
        with daemon.client() as client:
            attached = client.attach(e0.fingerprint, e0.fields, device=0, tensor_format="memoryview")
            pointers = {n: t.pointer for n, t in attached.tensors.items()}

            def reads(want):
                # The fake's device memory is host memory: the views read it directly.
                return all(ctypes.string_at(attached.tensors[n].pointer, len(want[n])) == want[n] for n in want)

            out["before"] = reads(want0)
            lease0 = attached.lease_id
            out["switched"] = attached.switch_to(e1.fingerprint, e1.fields) is attached
            out["afterSwitch"] = reads(want1)
            out["samePointers"] = {n: t.pointer for n, t in attached.tensors.items()} == pointers
            out["leases"] = [len(client.stats(e0.fingerprint)["leases"]), len(client.stats(e1.fingerprint)["leases"])]
            out["leaseChanged"] = attached.lease_id != lease0
            attached.switch_to(e0.fingerprint, e0.fields)
            out["afterSwitchBack"] = reads(want0) and {n: t.pointer for n, t in attached.tensors.items()} == pointers
            # A fingerprint the daemon does not serve: a mismatch, and the tensors still read version 0.
            miss = attached.switch_to("0" * 64)
            out["unservedIsMismatch"] = type(miss).__name__ == "Mismatch" and reads(want0)
            # Descriptors that do not map: refused, all or nothing.
            state = client.get_state(e1.fingerprint, fingerprint_fields=e1.fields)
            null = os.open("/dev/null", os.O_RDONLY)
            try:
                attached._mapping.remap(state, {0: null})
                out["badFdRefused"] = False
            except CudaError as err:
                out["badFdRefused"] = err.code == "E_CUDA" and reads(want0)
            finally:
                os.close(null)
            client.detach(state["leaseId"])
            # An update from a new checkpoint directory (hot swap), followed in place: the engine
            # hears model_ready for the name it watches and switches to that fingerprint.
            v2 = os.path.join(work, "v2")
            other_version(MODEL, v2, 0x0F)
            want2 = checkpoint_tensors(v2)
            name = os.path.basename(MODEL)
            client.watch(name)
            ctl = subprocess.run(["node", str(MAIN_JS), "ctl", "--weight-cache-socket-dir", daemon.socket_dir, "load", "--model", v2, "--name", name, "-tp", "1"],
                                 env={**os.environ, "WEIGHTD_HOST_DEVICES": daemon.device}, capture_output=True, text=True, timeout=120)
            out["ctlLoad"] = ctl.returncode
            events = []
            while not any(e.get("event") == "model_ready" for e in events):
                got = client.events(timeout=60.0)
                if not got:
                    break
                events += got
            ready = next((e for e in events if e.get("event") == "model_ready"), None)
            out["heardReady"] = ready is not None and ready["fingerprint"] != e0.fingerprint
            if ready is not None:
                attached.switch_to(ready["fingerprint"])
                out["followedUpdate"] = reads(want2) and {n: t.pointer for n, t in attached.tensors.items()} == pointers
            # Held now: the version switched to last (the announced one), with this one lease.
            last = ready["fingerprint"] if ready is not None else e0.fingerprint
            out["leasesHeld"] = len(client.stats(last)["leases"])
            # An attach detached while one of its views lives: its lease ends once the view is
            # freed (from the finalizer, on a connection of its own), not before.
            import gc

            second = client.attach(last, device=0, tensor_format="memoryview")
            kept = next(iter(second.tensors.values()))
            second.detach()
            out["leasesWhileAViewLives"] = len(client.stats(last)["leases"])
            del kept  # the finalizer's detach is a request answered before it returns
            gc.collect()
            out["leasesOnceFreed"] = len(client.stats(last)["leases"])
            attached.tensors = {}
            attached.detach()
            out["leasesAfter"] = client.stats(last)["leases"]
        daemon.stop()
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    print(json.dumps(out))


def daemon_switch_shared() -> None:
    """switch_to between versions that share segments (issue 31): the driver calls and the
    descriptors the reader spends on each switch, counted, and the bytes it reads after it."""
    import tempfile

    from daemon_fixture import Daemon, counting_fds
    from test_host_fds import MODEL, checkpoint_tensors
    from weightd_client.cuda import _Driver

    want = checkpoint_tensors()
    work = tempfile.mkdtemp(prefix="weightd-cuda-switch-shared-")
    plan = os.path.join(work, "plan.json")
    with open(plan, "w") as f:
        json.dump({"rules": [], "segmentBytes": 1 << 20}, f)
    import threading

    d = _Driver.get()
    calls: dict = {}
    total: dict = {}  # since the process started: what FAKE_CUDA_VMM_FAIL's N counts
    releasers: list = []  # the thread of each cuMemRelease
    for name in ("cuMemImportFromShareableHandle", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemRelease", "cuCtxSynchronize"):
        def counted(*args, _f=getattr(d, name), _n=name):
            calls[_n] = calls.get(_n, 0) + 1
            total[_n] = total.get(_n, 0) + 1
            if _n == "cuMemRelease":
                releasers.append(threading.current_thread().name)
            return _f(*args)
        setattr(d, name, counted)
    out: dict = {}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan]) as daemon:
        with daemon.client() as client:
            received = counting_fds(client)
            onlooker = daemon.client()  # looks on, from outside the reader's client
            name = client.ping()["name"]
            base = served_fingerprint(client, name, 0)
            calls.clear()
            reader = client.attach(base, device=0, tensor_format="memoryview")
            out["attachCalls"] = dict(calls)
            pointers = {n: t.pointer for n, t in reader.tensors.items()}
            out["segments"] = len(reader.state["segments"])
            out["memoryNamed"] = all(isinstance(seg.get("memory"), str) for seg in reader.state["segments"])

            def reads(expected):
                # The fake's device memory is host memory: the reader's views read it directly.
                return all(ctypes.string_at(reader.tensors[n].pointer, len(expected[n])) == expected[n] for n in expected) and {n: t.pointer for n, t in reader.tensors.items()} == pointers

            def held_retirer():
                """Holds each job given to the client's retirer until the event returned is set
                (what a switch lets go of waits for it; requests before that do not)."""
                gate = threading.Event()
                submit = type(client._retirer).submit.__get__(client._retirer)
                client._retirer.submit = lambda job: submit(lambda: (gate.wait(), job()))
                return gate

            def switched(fingerprint, watch=None):
                """What one switch cost: the driver calls and descriptors until switch_to returned
                (the client's retirer held meanwhile), then the calls the retirer made after it
                (``retired``), and what it said it did. ``watch``: the fingerprint whose leases are
                counted, on another client, before the retirer runs and after."""
                calls.clear()
                received.clear()
                gate = held_retirer()
                try:
                    reader.switch_to(fingerprint)
                    stall = dict(calls)
                    held = len(onlooker.stats(watch)["leases"]) if watch else None
                finally:
                    gate.set()
                    del client._retirer.submit
                client.settle()
                got = {"calls": stall, "retired": {c: v - stall.get(c, 0) for c, v in calls.items() if v != stall.get(c, 0)}, "fds": sum(received), "did": {k: v for k, v in reader.last_switch.items() if k not in ("seconds", "split")}}
                # The stall's split (sync, remaps, grants) covers its seconds, no more and no less.
                split = reader.last_switch["split"]
                assert sorted(split) == ["grantSeconds", "remapSeconds", "syncSeconds"] and min(split.values()) >= 0, split
                assert abs(sum(split.values()) - reader.last_switch["seconds"]) < 1e-6, (split, reader.last_switch["seconds"])
                if watch:
                    got["leasesOfOld"] = [held, len(onlooker.stats(watch)["leases"])]
                return got

            def write(base_fp, tensors):
                with client.begin_update(name, base_fp, device=0, tensors=sorted(tensors)) as upd:
                    for n, v in tensors.items():
                        upd.write(n, v)
                    return upd.commit()

            # A full update: every segment changes.
            full = {n: bytes((b + 1) % 256 for b in v) for n, v in want.items()}
            v1 = write(base, full)
            out["full"] = switched(v1["fingerprint"], watch=base)
            out["fullReads"] = reads(full)
            # One tensor: its segment changes, every other is the same allocation as version 1's.
            one = next(n for n in sorted(want) if want[n])
            out["oneSegment"] = next(t["segment"] for t in reader.state["tensors"] if t["name"] == one)
            partial = {**full, one: bytes((b + 7) % 256 for b in full[one])}
            v2 = write(v1["fingerprint"], {one: partial[one]})
            out["partial"] = switched(v2["fingerprint"])
            out["partialReads"] = reads(partial)
            out["leases"] = [len(client.stats(v1["fingerprint"])["leases"]), len(client.stats(v2["fingerprint"])["leases"])]
            # Prepared ahead (at the event): the imports happen then, the switch only remaps.
            other = next(n for n in sorted(want, reverse=True) if want[n] and n != one)
            again = {**partial, other: bytes((b + 3) % 256 for b in partial[other])}
            v3 = write(v2["fingerprint"], {other: again[other]})
            calls.clear()
            reader.prepare_switch(v3["fingerprint"])
            out["prepareCalls"], out["readsV2WhilePrepared"] = dict(calls), reads(partial)
            out["leasesWhilePrepared"] = [len(client.stats(v2["fingerprint"])["leases"]), len(client.stats(v3["fingerprint"])["leases"])]
            out["prepared"] = switched(v3["fingerprint"])
            out["preparedReads"] = reads(again)
            # To version 1 (retained): two segments differ, apart (two runs). A map that fails
            # midway puts every segment back: the views read version 3 under its lease. (A
            # failing read-only access is taken for a driver that refuses read-only mappings and
            # retried read-write, so it is not a failure to inject here.)
            for call, nth in (("cuMemMap", 2),):
                os.environ["FAKE_CUDA_VMM_FAIL"] = f"{call}:{total.get(call, 0) + nth}"
                try:
                    reader.switch_to(v1["fingerprint"])
                    out[f"{call}Failed"] = None
                except Exception as err:  # noqa: BLE001 - the code and what is left are checked
                    out[f"{call}Failed"] = [getattr(err, "code", str(err)), reads(again), reader.state["fingerprint"] == v3["fingerprint"],
                                            [len(client.stats(fp)["leases"]) for fp in (v1["fingerprint"], v3["fingerprint"])]]
                del os.environ["FAKE_CUDA_VMM_FAIL"]
            out["twoRuns"] = switched(v1["fingerprint"])
            out["twoRunsReads"] = reads(full)
            out["backToV3"] = switched(v3["fingerprint"])
            # Back to version 2 (retained): only the segment v3 wrote differs.
            out["back"] = switched(v2["fingerprint"])
            out["backReads"] = reads(partial)
            # The version mapped already: nothing to do.
            out["same"] = switched(v2["fingerprint"])
            # A daemon that names no segment's memory (older than the names): every segment changes.
            unnamed = {**reader.state, "segments": [{k: v for k, v in seg.items() if k != "memory"} for seg in reader.state["segments"]]}
            out["unnamedChanged"] = reader._mapping.changed_segments(unnamed)
            # A prepared switch dropped by detach gives back its imports and its lease.
            reader.prepare_switch(v3["fingerprint"])
            try:
                client.conn.request_fds("get_segment_fds", leaseId=reader.lease_id, segments=[out["segments"] + 5])
                out["unknownSegmentRefused"] = None
            except Exception as err:  # noqa: BLE001 - the code is what is checked
                out["unknownSegmentRefused"] = getattr(err, "code", str(err))
            reader.tensors = {}
            reader.detach()
            out["leasesAfter"] = [len(client.stats(fp)["leases"]) for fp in (v2["fingerprint"], v3["fingerprint"])]
            # A mapping closed before the retirer ran: the close releases what the switch
            # replaced (the retirer then finds nothing), and the detach waits for the retirer.
            late = client.attach(v2["fingerprint"], device=0, tensor_format="memoryview")
            gate = held_retirer()
            late.switch_to(v3["fingerprint"])
            del client._retirer.submit
            releasers.clear()
            opener = threading.Timer(0.2, gate.set)
            opener.start()
            late.tensors = {}
            late.detach()
            opener.join()
            out["closeReleased"] = sorted(set(releasers))
            out["leasesAfterLate"] = [len(onlooker.stats(fp)["leases"]) for fp in (v2["fingerprint"], v3["fingerprint"])]
            onlooker.close()
        daemon.stop()
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    print(json.dumps(out))


def vmm_fds(pid: int) -> int:
    """Descriptors of fake VMM memory process ``pid`` holds: on the daemon's side of an update, a
    staging or final allocation is held by its descriptor alone."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:fakecuda-vmm-")
        except OSError:
            continue
    return n


def settled_vmm_fds(pid: int) -> int:
    """vmm_fds once it holds still: an update's end closes its descriptors after its connection's
    end, and a commit what it let go of after its reply (on the daemon's addon threads), neither
    of which this process waits for."""
    import time

    last, still = vmm_fds(pid), 0
    for _ in range(100):
        time.sleep(0.05)
        now = vmm_fds(pid)
        still = still + 1 if now == last else 0
        last = now
        if still >= 4:
            break
    return last


def settled_threads(pid: int) -> int:
    """How many threads process ``pid`` runs, once that holds still."""
    import time

    last, still = len(os.listdir(f"/proc/{pid}/task")), 0
    for _ in range(100):
        time.sleep(0.05)
        now = len(os.listdir(f"/proc/{pid}/task"))
        still = still + 1 if now == last else 0
        last = now
        if still >= 6:
            break
    return last


def settled_inodes(pid: int) -> set:
    """vmm_inodes once it holds still (an update's descriptors close after its reply)."""
    import time

    last, still = vmm_inodes(pid), 0
    for _ in range(100):
        time.sleep(0.05)
        now = vmm_inodes(pid)
        still = still + 1 if now == last else 0
        last = now
        if still >= 4:
            break
    return last


def vmm_inodes(pid: int) -> set:
    """The distinct allocations of fake VMM memory process ``pid`` holds a descriptor of (a
    duplicate of one it holds already adds none)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:fakecuda-vmm-"):
                out.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            continue
    return out


def code(call) -> "str | None":
    """The error code ``call`` is refused with, None when it is not."""
    from weightd_client.protocol import WeightdError

    try:
        call()
        return None
    except WeightdError as err:
        return err.code


def segment_plan(prefix: str) -> str:
    """A plan file cutting the arena into 1 MiB segments (several segments per rank, as a model's
    are), in a fresh folder named by ``prefix``; returns its path."""
    import tempfile

    plan = os.path.join(tempfile.mkdtemp(prefix=prefix), "plan.json")
    with open(plan, "w") as f:
        json.dump({"rules": [], "segmentBytes": 1 << 20}, f)
    return plan


def served_fingerprint(client, name: str, version: int) -> str:
    return next(v["fingerprint"] for v in client.ping()["models"] if v["name"] == name and v.get("version") == version and v["status"] == "serving")


def daemon_update() -> None:
    import subprocess
    import tempfile

    from daemon_fixture import Daemon
    from test_host_fds import MODEL, checkpoint_tensors

    want = checkpoint_tensors()
    work = tempfile.mkdtemp(prefix="weightd-cuda-update-")
    plan = os.path.join(work, "plan.json")
    with open(plan, "w") as f:
        json.dump({"rules": [], "segmentBytes": 1 << 20}, f)
    out = {}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan]) as daemon:
        with daemon.client() as client:
            name = client.ping()["name"]
            base = served_fingerprint(client, name, 0)
            reader = client.attach(base, device=0, tensor_format="memoryview")
            pointers = {n: t.pointer for n, t in reader.tensors.items()}

            def reads(expected):
                # The fake's device memory is host memory: the reader's views read it directly.
                return all(ctypes.string_at(reader.tensors[n].pointer, len(expected[n])) == expected[n] for n in expected)

            # A full update: every tensor written from host bytes through the staging mapping.
            full = {n: bytes((b + 1) % 256 for b in v) for n, v in want.items()}
            with client.begin_update(name, base, device=0) as upd:
                out["fullSegments"] = len({t["segment"] for t in upd.tensors.values()})
                for n, v in full.items():
                    upd.write(n, v)
                out["readerKeepsBaseWhileWriting"] = reads(want)
                done = upd.commit()
            out["fullVersion"] = done["version"]
            out["fullFingerprint"] = done["modelFingerprint"]
            out["readerKeepsBaseAfterCommit"] = reads(want)
            reader.switch_to(done["fingerprint"])
            out["fullAfterSwitch"] = reads(full) and {n: t.pointer for n, t in reader.tensors.items()} == pointers

            # A partial update: one tensor of one segment; the rest is shared with version 1.
            one = next(n for n in sorted(want) if want[n])
            partial = {**full, one: bytes((b + 7) % 256 for b in full[one])}
            with client.begin_update(name, done["fingerprint"], device=0, tensors=[one]) as upd:
                out["partialNamed"] = sorted(upd.tensors)
                out["partialCopied"] = len(upd._cuda.pointers)
                # Through a writable view (the fake's device memory is this process's mapping).
                view = upd.tensor(one, "cuda_array")
                ctypes.memmove(view.pointer, partial[one], len(partial[one]))
                try:
                    upd.write(sorted(set(want) - {one})[0], b"")
                    out["notNamedRefused"] = None
                except Exception as err:  # noqa: BLE001 - the code is what is checked
                    out["notNamedRefused"] = getattr(err, "code", str(err))
                try:
                    upd.commit()
                    out["viewAliveRefused"] = None
                except Exception as err:  # noqa: BLE001
                    out["viewAliveRefused"] = getattr(err, "code", str(err))
                del view
                second = upd.commit()
            out["partialFingerprint"] = second["modelFingerprint"]
            segment_of = {t["name"]: t["segment"] for t in reader.state["tensors"]}
            out["partialSegmentTensors"] = sum(1 for n in segment_of if segment_of[n] == segment_of[one])
            out["tensorCount"] = len(segment_of)
            out["partialKeepsFullBeforeSwitch"] = reads(full)
            reader.switch_to(second["fingerprint"])
            out["partialAfterSwitch"] = reads(partial) and {n: t.pointer for n, t in reader.tensors.items()} == pointers

            # A writer killed mid-update leaves no allocation in the daemon. (The commits before
            # close what they let go of on the daemon's addon threads, after their replies.)
            idle = settled_vmm_fds(daemon.proc.pid)
            writer = subprocess.Popen([sys.executable, __file__, "update_writer", client.socket_path, name, second["fingerprint"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            out["writerBegun"] = writer.stdout.readline().strip()
            out["daemonHeldWhileWriting"] = vmm_fds(daemon.proc.pid) - idle
            writer.kill()
            writer.wait()
            # The daemon ends the killed writer's update when its connection closes: begin again until it has.
            for _ in range(600):
                try:
                    again = client.begin_update(name, second["fingerprint"], device=0)
                    break
                except Exception as err:  # noqa: BLE001
                    if getattr(err, "code", None) != "E_UPDATE_BUSY":
                        raise
                    client.ping()
            out["daemonHeldByNextUpdate"] = settled_vmm_fds(daemon.proc.pid) - idle
            again.abandon()
            out["versions"] = sorted(v.get("version") for v in client.ping()["models"] if v["name"] == name and v["status"] == "serving")
            reader.tensors = {}
            reader.detach()
        daemon.stop()
        # How many tensors each commit read and digested (the rest reused the base's digests).
        out["sealedRead"] = [json.loads(line)["read"] for line in daemon.stderr_lines if '"update sealed' in line]
        out["daemonPid"] = daemon.proc.pid
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    # The same bytes written on the host backend: the same version (docs/spec/fingerprint.md §9),
    # so the digests hashed from device memory are the fill's digests of those bytes.
    with Daemon(MODEL, device="host", extra_args=["--plan-file", plan]) as host:
        with host.client() as client:
            name = client.ping()["name"]
            with client.begin_update(name, served_fingerprint(client, name, 0)) as upd:
                for n, v in full.items():
                    upd.write(n, v)
                host_full = upd.commit()
            out["hostFingerprint"] = host_full["modelFingerprint"]
            with client.begin_update(name, host_full["fingerprint"], tensors=[one]) as upd:
                upd.write(one, partial[one])
                out["hostPartialFingerprint"] = upd.commit()["modelFingerprint"]
    out["clientPid"] = os.getpid()
    out["writerPid"] = writer.pid
    print(json.dumps(out))


def update_writer(socket_path: str, name: str, base: str) -> None:
    from weightd_client import WeightdClient

    with WeightdClient(socket_path) as client:
        upd = client.begin_update(name, base, device=0)
        assert upd._cuda is not None and upd._cuda.pointers
        print("begun", flush=True)
        sys.stdin.read()  # killed here


class TrainerMemory:
    """Device memory of this process on fake GPU 0 (cuMemAlloc in its primary context), holding
    ``tensors`` packed at 256-byte steps after ``lead`` bytes, so that their offsets differ from the
    daemon's layout; each tensor is a ``CudaBuffer`` over its bytes. ``free()`` gives it back."""

    def __init__(self, tensors: dict, lead: int = 512):
        from weightd_client.cuda import CudaBuffer

        self.lib = lib = ctypes.CDLL("libcuda.so.1")
        self.ctx, self.ptr = ctypes.c_void_p(), ctypes.c_uint64()
        places, at = {}, lead
        for name, data in tensors.items():
            places[name] = at
            at += (len(data) + 255) // 256 * 256
        assert lib.cuInit(0) == 0 and lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), 0) == 0
        assert lib.cuCtxPushCurrent_v2(self.ctx) == 0
        assert lib.cuMemAlloc_v2(ctypes.byref(self.ptr), ctypes.c_size_t(at)) == 0
        assert lib.cuCtxPopCurrent_v2(None) == 0
        self.places = places
        self.tensors = {}
        self.write(tensors)
        for name, data in tensors.items():
            self.tensors[name] = CudaBuffer(self.ptr.value + places[name], len(data), "U8", [len(data)], raw=True)

    def write(self, tensors: dict) -> None:
        """New bytes into the same memory, as a trainer's optimizer step writes its parameters in place."""
        for name, data in tensors.items():
            ctypes.memmove(self.ptr.value + self.places[name], data, len(data))  # the fake's device memory is this process's mapping

    def free(self) -> None:
        lib = self.lib
        assert lib.cuCtxPushCurrent_v2(self.ctx) == 0 and lib.cuMemFree_v2(self.ptr) == 0
        assert lib.cuCtxPopCurrent_v2(None) == 0 and lib.cuDevicePrimaryCtxRelease_v2(0) == 0


def pull_locate() -> None:
    """PullSources.locate on the fake GPU: where each tensor lies (handle, offset) for tensors of
    two allocations, how many cuMemGetAddressRange calls it made, and its refusals."""
    from weightd_client.cuda import CudaBuffer
    from weightd_client.protocol import ProtocolError
    from weightd_client.pull import PullSources

    one = TrainerMemory({"a": b"\1" * 1000, "b": b"\2" * 3000, "c": b"\3" * 256})
    two = TrainerMemory({"d": b"\4" * 512})
    sources = PullSources(0)
    calls = []
    real = sources.driver.cuMemGetAddressRange
    sources.driver.cuMemGetAddressRange = lambda *args: calls.append(1) or real(*args)
    out = {"located": {n: list(sources.locate(n, v)) for m in (one, two) for n, v in m.tensors.items()}, "handles": len(sources.handles)}
    out["rangeCalls"] = len(calls)
    # A view that starts inside a known allocation but runs past its end: refused from what was found.
    past = CudaBuffer(one.tensors["c"].pointer, 4096, "U8", [4096], raw=True)
    try:
        sources.locate("past", past)
        out["past"] = None
    except ProtocolError as err:
        out["past"] = err.code
    out["rangeCallsAfter"] = len(calls)
    sources.driver.cuMemGetAddressRange = real
    sources.close()
    one.free()
    two.free()
    print(json.dumps(out), flush=True)


def daemon_pull() -> None:
    import subprocess
    import tempfile
    import time

    from daemon_fixture import Daemon
    from test_host_fds import MODEL, checkpoint_tensors
    from weightd_client.protocol import WeightdError

    want = checkpoint_tensors()
    work = tempfile.mkdtemp(prefix="weightd-cuda-pull-")
    plan = os.path.join(work, "plan.json")
    with open(plan, "w") as f:
        json.dump({"rules": [], "segmentBytes": 1 << 20}, f)
    out = {}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan]) as daemon:
        with daemon.client() as client:
            name = client.ping()["name"]
            base = served_fingerprint(client, name, 0)
            reader = client.attach(base, device=0, tensor_format="memoryview")
            pointers = {n: t.pointer for n, t in reader.tensors.items()}
            idle, idle_memory = vmm_fds(daemon.proc.pid), vmm_inodes(daemon.proc.pid)

            def reads(expected):
                return all(ctypes.string_at(reader.tensors[n].pointer, len(expected[n])) == expected[n] for n in expected)

            # A full pull: every tensor from one allocation of the trainer's, at offsets of its own.
            full = {n: bytes((b + 1) % 256 for b in v) for n, v in want.items()}
            trainer = TrainerMemory(full)
            threads_before = settled_threads(daemon.proc.pid)
            with client.begin_update(name, base, device=0, source="pull") as upd:
                out["pullHandedSegments"] = len(upd._maps) + (len(upd._cuda.pointers) if upd._cuda else 0)
                out["pullNoStaging"] = code(lambda: upd.write(sorted(want)[0], b""))
                out["daemonMadeWhilePulling"] = len(vmm_inodes(daemon.proc.pid) - idle_memory)
                got = upd.pull_from(trainer.tensors)
                # The finals are made (and written) as the tensors are named, off pull_tensors' reply.
                segments = len({t["segment"] for t in reader.state["tensors"]})
                for _ in range(100):
                    made_early = vmm_inodes(daemon.proc.pid) - idle_memory
                    if len(made_early) >= segments:
                        break
                    time.sleep(0.05)
                out["daemonMadeAfterPull"] = [len(made_early), segments]
                out["pulledReply"] = [got["pulled"], got["tensors"]]
                out["pullAgain"] = code(lambda: upd.pull_from({sorted(want)[0]: trainer.tensors[sorted(want)[0]]}))
                out["readerKeepsBaseWhilePulling"] = reads(want)
                done = upd.commit()
            out["fullVersion"] = done["version"]
            # The version serves the allocations made at pull time: the commit made none.
            out["servesEarlyFinals"] = settled_inodes(daemon.proc.pid) - idle_memory == made_early
            # Its rank adopted the finals on the daemon's main thread: no worker thread was started for it.
            out["threadsAddedByCommit"] = settled_threads(daemon.proc.pid) - threads_before
            # The trainer's memory goes at once: the version is the daemon's own copy.
            trainer.free()
            out["readerKeepsBaseAfterCommit"] = reads(want)
            reader.switch_to(done["fingerprint"])
            out["fullAfterSwitch"] = reads(full) and {n: t.pointer for n, t in reader.tensors.items()} == pointers
            # The same bytes through the staging path: the same content, so the same version (its
            # digests, hashed from the staging copy, are those of the pulled bytes).
            with client.begin_update(name, base, device=0) as upd:
                for n, v in full.items():
                    upd.write(n, v)
                staged = upd.commit()
            out["stagedSameVersion"] = [staged["version"], staged["modelFingerprint"] == done["modelFingerprint"]]

            # A partial pull: one tensor, from an allocation of its own; every other segment shared.
            # At an offset 4 bytes off a word boundary: the digest kernel cannot copy it (its
            # stores are whole words), so the driver does, and the kernel only hashes.
            one = next(n for n in sorted(want) if want[n])
            partial = {**full, one: bytes((b + 7) % 256 for b in full[one])}
            other = TrainerMemory({one: partial[one]}, lead=4100)
            with client.begin_update(name, done["fingerprint"], device=0, source="pull") as upd:
                upd.pull_from(other.tensors)
                second = upd.commit()
            other.free()
            out["partialVersion"] = second["version"]
            reader.switch_to(second["fingerprint"])
            out["partialAfterSwitch"] = reads(partial) and {n: t.pointer for n, t in reader.tensors.items()} == pointers
            segment_of = {t["name"]: t["segment"] for t in reader.state["tensors"]}
            out["partialSegmentTensors"] = sum(1 for n in segment_of if segment_of[n] == segment_of[one])
            # What the full pull and the one-tensor pull copied (the staging commit between them pulls nothing).
            out["pulledBytes"] = [sum(len(v) for v in full.values()), None, len(partial[one])]

            # Refusals, each leaving nothing: checked by the client, then by the daemon itself.
            small = TrainerMemory({one: partial[one][:-1], "x": b"\0" * 64})
            with client.begin_update(name, second["fingerprint"], device=0, source="pull") as upd:
                out["clientBadSize"] = code(lambda: upd.pull_from({one: small.tensors[one]}))
                out["clientUnknown"] = code(lambda: upd.pull_from({"no.such.tensor": small.tensors["x"]}))
                src, offset, _ = upd._pull.locate("x", small.tensors["x"])
                handle = upd._pull.handles[src]
                raw = lambda tensors: upd.conn.request("pull_tensors", update=upd.id, sources=[handle], tensors=tensors)  # noqa: E731
                nbytes = len(want[one])
                out["daemonUnknown"] = code(lambda: raw([{"name": "no.such.tensor", "source": 0, "offset": 0, "bytes": 1}]))
                out["daemonBadSize"] = code(lambda: raw([{"name": one, "source": 0, "offset": 0, "bytes": nbytes + 1}]))
                out["daemonBadSource"] = code(lambda: raw([{"name": one, "source": 1, "offset": 0, "bytes": nbytes}]))
                out["daemonTwice"] = code(lambda: raw([{"name": one, "source": 0, "offset": 0, "bytes": nbytes}, {"name": one, "source": 0, "offset": 0, "bytes": nbytes}]))
                out["daemonEmptyCommit"] = code(lambda: upd.conn.request("commit_update", update=upd.id))
                # Past the end of the trainer's allocation: found when the daemon opens it, at commit.
                raw([{"name": one, "source": 0, "offset": offset + 64, "bytes": nbytes}])
                out["daemonPastAllocation"] = code(lambda: upd.conn.request("commit_update", update=upd.id))
            small.free()
            with client.begin_update(name, second["fingerprint"], device=0) as upd:
                out["stagingPullRefused"] = code(lambda: upd.conn.request("pull_tensors", update=upd.id, sources=[handle], tensors=[{"name": one, "source": 0, "offset": 0, "bytes": nbytes}]))
            out["wrongDevice"] = code(lambda: client.conn.request("begin_update", model=name, base=second["fingerprint"], source="pull", device="GPU-ffffffff-0000-0000-0000-000000000000"))
            out["pullWithTensors"] = code(lambda: client.conn.request("begin_update", model=name, base=second["fingerprint"], source="pull", device=DEVICE0, tensors=[one]))
            # A handle whose exporter freed its memory and exited: the driver does not open it.
            exporter = subprocess.Popen([sys.executable, __file__, "export"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            gone = exporter.stdout.readline().strip()
            exporter.communicate("")
            assert exporter.returncode == 0
            # With a live source opened before it: the daemon closes that one too (its leak report).
            two = next(n for n in sorted(want) if want[n] and n != one)
            live = TrainerMemory({two: full[two]})
            with client.begin_update(name, second["fingerprint"], device=0, source="pull") as upd:
                upd.pull_from(live.tensors)
                upd.conn.request("pull_tensors", update=upd.id, sources=[gone], tensors=[{"name": one, "source": 0, "offset": 0, "bytes": nbytes}])
                try:
                    upd.conn.request("commit_update", update=upd.id)
                    out["goneSource"] = None
                except WeightdError as err:
                    out["goneSource"], out["goneMessage"] = err.code, str(err)
                # That failure ended the update: the model takes another at once, while this
                # writer's connection is still open.
                try:
                    client.begin_update(name, second["fingerprint"], device=0, source="pull").abandon()
                    out["beginAfterFailedPull"] = "begun"
                except WeightdError as err:
                    out["beginAfterFailedPull"] = err.code
            live.free()

            # A writer killed after pulling, before commit, leaves no version and nothing held.
            before = settled_vmm_fds(daemon.proc.pid)
            writer = subprocess.Popen([sys.executable, __file__, "pull_writer", client.socket_path, name, second["fingerprint"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            out["writerPulled"] = writer.stdout.readline().strip()
            out["heldByKilledWriter"] = settled_vmm_fds(daemon.proc.pid) - before
            writer.kill()
            writer.wait()
            for _ in range(600):
                try:
                    again = client.begin_update(name, second["fingerprint"], device=0, source="pull")
                    break
                except WeightdError as err:
                    if err.code != "E_UPDATE_BUSY":
                        raise
                    client.ping()
            # The killed writer's references to the base are all closed: the next pull holds as many.
            out["heldByNextPull"] = settled_vmm_fds(daemon.proc.pid) - before
            again.abandon()
            out["versions"] = sorted(v.get("version") for v in client.ping()["models"] if v["name"] == name and v["status"] == "serving")
            reader.tensors = {}
            reader.detach()
        daemon.stop()
        out["sealed"] = [{k: json.loads(line).get(k) for k in ("read", "pulled")} for line in daemon.stderr_lines if '"update sealed' in line]
        # Per commit: tensors its pulls digested as they were copied, and allocations the commit mapped.
        out["hashedOn"] = [json.loads(line).get("hashedOn") for line in daemon.stderr_lines if '"update sealed' in line]
        out["sealedAtPull"] = [[json.loads(line).get("digestedAtPull"), json.loads(line).get("timings", {}).get("mapped")] for line in daemon.stderr_lines if '"update sealed' in line]
        out["sealedTimings"] = [sorted(json.loads(line).get("timings", {})) for line in daemon.stderr_lines if '"update sealed' in line]
        out["pullTimings"] = [sorted(json.loads(line)["timings"].get("pullTimings", {})) for line in daemon.stderr_lines if '"update sealed' in line]
        out["copiedByKernel"] = [json.loads(line)["timings"].get("pullTimings", {}).get("copiedByKernelBytes") for line in daemon.stderr_lines if '"update sealed' in line]
        out["committedTimings"] = [sorted(k for k in json.loads(line) if k.endswith("Ms")) for line in daemon.stderr_lines if '"update committed' in line]
        out["daemonPid"] = daemon.proc.pid
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    out["clientPid"] = os.getpid()
    out["writerPid"] = writer.pid
    print(json.dumps(out))


def daemon_pull_prepared() -> None:
    """Pulls begun with ``prepare``: the finals are made at begin, before any tensor is named, and
    the pulls' copies go straight into them; what no pull wrote is freed at commit; an update
    abandoned before its pull leaves nothing; refusals name what to do."""
    import time

    from daemon_fixture import Daemon
    from test_host_fds import MODEL, checkpoint_tensors

    def made_since(pid, idle, count):
        """The daemon's allocations beyond ``idle`` once there are ``count`` (or 5 s passed)."""
        for _ in range(100):
            now = vmm_inodes(pid) - idle
            if len(now) >= count:
                return now
            time.sleep(0.05)
        return now

    want = checkpoint_tensors()
    plan = segment_plan("weightd-cuda-prepared-")
    out = {}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan]) as daemon:
        pid = daemon.proc.pid
        with daemon.client() as client:
            name = client.ping()["name"]
            base = served_fingerprint(client, name, 0)
            reader = client.attach(base, device=0, tensor_format="memoryview")
            segment_of = {t["name"]: t["segment"] for t in reader.state["tensors"]}
            segments = len(set(segment_of.values()))
            idle = settled_inodes(pid)

            def reads(expected):
                return all(ctypes.string_at(reader.tensors[n].pointer, len(expected[n])) == expected[n] for n in expected)

            # Every segment prepared: its finals exist before the first pull_tensors.
            full = {n: bytes((b + 3) % 256 for b in v) for n, v in want.items()}
            trainer = TrainerMemory(full)
            with client.begin_update(name, base, device=0, source="pull", prepare=True) as upd:
                prepared = made_since(pid, idle, segments)
                out["madeBeforePull"] = [len(prepared), segments]
                upd.pull_from(trainer.tensors)
                done = upd.commit()
            trainer.free()
            out["fullServesPrepared"] = settled_inodes(pid) - idle == prepared
            reader.switch_to(done["fingerprint"])
            out["fullReads"] = reads(full)
            # The same bytes staged are the same content: the prepared pull's digests are those bytes'.
            with client.begin_update(name, base, device=0) as upd:
                for n, v in full.items():
                    upd.write(n, v)
                staged = upd.commit()
            out["stagedSame"] = [done["version"], staged["version"], staged["modelFingerprint"] == done["modelFingerprint"]]

            # One tensor's segment prepared, that tensor pulled: one final made, at begin.
            one = next(n for n in sorted(want) if want[n])
            partial = {**full, one: bytes((b + 9) % 256 for b in full[one])}
            before = settled_inodes(pid)
            mine = TrainerMemory({one: partial[one]})
            with client.begin_update(name, done["fingerprint"], device=0, source="pull", tensors=[one], prepare=True) as upd:
                out["partialMadeBeforePull"] = len(made_since(pid, before, 1))
                upd.pull_from(mine.tensors)
                second = upd.commit()
            reader.switch_to(second["fingerprint"])
            out["partialReads"] = reads(partial)
            out["partialNew"] = len(settled_inodes(pid) - before)

            # Every segment prepared, one tensor pulled: the finals no pull wrote go at commit.
            third = {**partial, one: bytes((b + 1) % 256 for b in partial[one])}
            before = settled_inodes(pid)
            again = TrainerMemory({one: third[one]})
            with client.begin_update(name, second["fingerprint"], device=0, source="pull", prepare=True) as upd:
                made_since(pid, before, segments)
                upd.pull_from(again.tensors)
                out["thirdVersion"] = upd.commit()["version"]
            out["thirdNew"] = len(settled_inodes(pid) - before)

            # Abandoned after its finals were made, before any pull: nothing of it stays.
            before = settled_inodes(pid)
            upd = client.begin_update(name, second["fingerprint"], device=0, source="pull", prepare=True)
            out["abandonedMade"] = len(made_since(pid, before, segments))
            upd.abandon()
            out["abandonedLeft"] = len(settled_inodes(pid) - before)

            # pull_update names its tensors at begin: their segment's final is made as the pull goes.
            fourth = {**third, one: bytes((b + 5) % 256 for b in third[one])}
            last = TrainerMemory({one: fourth[one]})
            out["pullUpdate"] = client.pull_update(name, second["fingerprint"], last.tensors)["version"]

            # Refusals: by the client, then by the daemon for a writer that skips it.
            out["clientStagingPrepare"] = code(lambda: client.begin_update(name, base, device=0, prepare=True))
            out["clientListNoPrepare"] = code(lambda: client.begin_update(name, base, device=0, source="pull", tensors=[one]))
            out["daemonStagingPrepare"] = code(lambda: client.conn.request("begin_update", model=name, base=second["fingerprint"], prepare=True))
            out["daemonUnknown"] = code(lambda: client.conn.request("begin_update", model=name, base=second["fingerprint"], source="pull", device=DEVICE0, prepare=True, tensors=["no.such.tensor"]))
            for t in (mine, again, last):
                t.free()
            reader.tensors = {}
            reader.detach()
        daemon.stop()
        sealed = [json.loads(line) for line in daemon.stderr_lines if '"update sealed' in line and json.loads(line).get("pulled")]
        # What the pulls' own native calls did: a prepared pull makes and maps no final of its own.
        out["pullMade"] = [[s["timings"]["pullTimings"].get(k) for k in ("allocateMs", "mapMs")] for s in sealed]
        out["prepareMs"] = [s["timings"]["pullTimings"].get("prepareMs", -1) > 0 for s in sealed]
        out["begunPrepared"] = [json.loads(line).get("prepared") for line in daemon.stderr_lines if '"update begun' in line and json.loads(line).get("pull")]
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    print(json.dumps(out))


def daemon_pull_context(made_log: str) -> None:
    """Pulls, each a new version, with --keep-versions 1: the checkpoint's version drains after the
    second, and from then on every version served is a written one. How often the daemon made GPU 0's primary
    context (FAKE_CUDA_MADE_LOG) after that: a served version's device holds it, so never."""
    import time

    from daemon_fixture import Daemon
    from test_host_fds import MODEL, checkpoint_tensors

    want = checkpoint_tensors()
    plan = segment_plan("weightd-cuda-context-")
    out = {"versions": []}

    def made(pid):
        with open(made_log) as f:
            return sum(1 for line in f if line.split()[0] == str(pid))

    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan, "--keep-versions", "1"]) as daemon:
        pid = daemon.proc.pid
        with daemon.client() as client:
            name = client.ping()["name"]
            base = served_fingerprint(client, name, 0)
            for step in range(4):
                trainer = TrainerMemory({n: bytes((b + step + 1) % 256 for b in v) for n, v in want.items()})
                done = client.pull_update(name, base, trainer.tensors)
                trainer.free()
                base = done["fingerprint"]
                out["versions"].append(done["version"])
                if step == 1:
                    # The checkpoint's version drains (beyond --keep-versions 1 once version 2
                    # serves; no lease holds it); its rank's device goes.
                    for _ in range(200):
                        if not any(m.get("version") == 0 for m in client.ping()["models"] if m["name"] == name):
                            break
                        time.sleep(0.05)
                    out["madeBefore"] = made(pid)
            out["madeAfter"] = made(pid)
            out["serving"] = sorted(m.get("version") for m in client.ping()["models"] if m["name"] == name and m["status"] == "serving")
        daemon.stop()
    print(json.dumps(out))


def daemon_pull_releases_later(gate: str) -> None:
    """A pull whose writer's memory the daemon cannot close yet: each cuIpcCloseMemHandle of the
    daemon waits at FAKE_CUDA_IPC_CLOSE_GATE (``gate``, a FIFO). The commit answers all the same,
    since the addon's releaser thread lets go of what the pull held after it answered; once a byte
    opens the gate, the version serves the pulled bytes and the daemon ends with nothing left."""
    import threading

    from daemon_fixture import Daemon
    from test_host_fds import MODEL, checkpoint_tensors

    want = checkpoint_tensors()
    plan = segment_plan("weightd-cuda-release-later-")
    out: dict = {}
    os.environ["FAKE_CUDA_IPC_CLOSE_GATE"] = gate  # the daemon's only: this process closes no IPC handle
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan]) as daemon:
        del os.environ["FAKE_CUDA_IPC_CLOSE_GATE"]
        with daemon.client() as client:
            name = client.ping()["name"]
            base = served_fingerprint(client, name, 0)
            new = {n: bytes((b + 1) % 256 for b in v) for n, v in want.items()}
            trainer = TrainerMemory(new)
            result: dict = {}

            def update() -> None:
                try:
                    result["done"] = client.pull_update(name, base, trainer.tensors)
                except Exception as err:  # noqa: BLE001 - reported
                    result["error"] = repr(err)

            updating = threading.Thread(target=update, daemon=True)
            updating.start()
            updating.join(60)
            out["committedWhileCloseHeld"] = not updating.is_alive() and "done" in result

            def feed() -> None:
                # A byte for each close the daemon makes, from now on (each open waits for one).
                while True:
                    with open(gate, "wb") as f:
                        f.write(b"x")

            threading.Thread(target=feed, daemon=True).start()
            updating.join(60)
            out["error"] = result.get("error")
            done = result.get("done") or {}
            out["version"] = done.get("version")
            if done:
                reader = client.attach(done["fingerprint"], device=0, tensor_format="memoryview")
                out["reads"] = all(ctypes.string_at(reader.tensors[n].pointer, len(new[n])) == new[n] for n in new)
                reader.tensors = {}
                reader.detach()
            trainer.free()
        daemon.stop()
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    print(json.dumps(out))


def daemon_pull_prepare_refused() -> None:
    """A prepared pull whose finals do not fit the GPU: the making fails off begin's reply, and the
    pull or the commit says so by name; the update ends, leaving nothing, and the model takes the
    next update at once."""
    from daemon_fixture import Daemon
    from test_host_fds import MODEL, checkpoint_tensors
    from weightd_client.protocol import WeightdError

    want = checkpoint_tensors()
    # 1 MiB segments: every segment's final does not fit beside the arena, one segment's does.
    plan = segment_plan("weightd-cuda-prepare-refused-")
    out = {}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan]) as daemon:
        with daemon.client() as client:
            name = client.ping()["name"]
            base = served_fingerprint(client, name, 0)
            held = vmm_fds(daemon.proc.pid)
            trainer = TrainerMemory(want)
            out["begun"] = code(lambda: client.begin_update(name, base, device=0, source="pull", prepare=True).abandon())
            with client.begin_update(name, base, device=0, source="pull", prepare=True) as upd:
                try:
                    upd.pull_from(trainer.tensors)
                    upd.commit()
                    out["refused"] = None
                except WeightdError as err:
                    out["refused"], out["message"] = err.code, str(err)
            trainer.free()
            out["heldAfter"] = settled_vmm_fds(daemon.proc.pid) - held
            # Ended with its failure: a staging update of one tensor fits, and is taken at once.
            one = next(n for n in sorted(want) if want[n])
            with client.begin_update(name, base, device=0, tensors=[one]) as upd:
                upd.write(one, bytes(len(want[one])))
                out["next"] = upd.commit()["version"]
        daemon.stop()
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    print(json.dumps(out))


class Moving:
    """A dense byte array on fake GPU 0 at ``pointer``, which the test may change, as a tensor
    whose storage a trainer replaced moves (``__cuda_array_interface__``)."""

    def __init__(self, pointer: int, nbytes: int):
        self.pointer, self.nbytes = pointer, nbytes

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.pointer, False), "version": 3}


def daemon_pull_plan() -> None:
    """Pull plans: a trainer's tensors named once, then pulled by the plan in several updates (one
    prepared), each version the trainer's bytes of that step with the digests of a staged copy of
    them; the plan's memory opened and its kernel set up once, not per update; the refusals (a
    tensor moved, a tensor pulled twice, another process's plan, a closed plan, too many plans on a
    connection); nothing left once the plans close."""
    import subprocess

    from daemon_fixture import Daemon
    from test_host_fds import MODEL, checkpoint_tensors
    from weightd_client.protocol import Connection

    want = checkpoint_tensors()
    plan_file = segment_plan("weightd-cuda-pull-plan-")
    out: dict = {}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan_file]) as daemon:
        with daemon.client() as client:
            name = client.ping()["name"]
            base = served_fingerprint(client, name, 0)
            reader = client.attach(base, device=0, tensor_format="memoryview")
            pointers = {n: t.pointer for n, t in reader.tensors.items()}

            def reads(expected):
                return all(ctypes.string_at(reader.tensors[n].pointer, len(expected[n])) == expected[n] for n in expected)

            step_bytes = lambda step: {n: bytes((b + 11 * step + 1) % 256 for b in v) for n, v in want.items()}  # noqa: E731
            trainer = TrainerMemory(step_bytes(0))
            plan = client.pull_plan(name, trainer.tensors, device=0)
            out["planReply"] = [plan.reply["tensors"], plan.reply["sources"], sorted(plan.reply["timings"])]
            fingerprint, steps, steps_fingerprints = base, [], []
            for step in range(3):
                new = step_bytes(step)
                trainer.write(new)
                with client.begin_update(name, fingerprint, device=0, source="pull", prepare=step == 1) as upd:
                    got = upd.pull_from(plan)
                    done = upd.commit()
                fingerprint = done["fingerprint"]
                steps_fingerprints.append(fingerprint)
                reader.switch_to(fingerprint)
                steps.append([done["version"], got["pulled"] == got["tensors"] == len(want), reads(new), {n: t.pointer for n, t in reader.tensors.items()} == pointers])
            out["steps"] = steps
            # The same bytes staged are the same version's content: the plan's digests are its bytes'.
            with client.begin_update(name, steps_fingerprints[1], device=0) as upd:
                for n, v in step_bytes(2).items():
                    upd.write(n, v)
                staged = upd.commit()
            out["stagedSame"] = staged["modelFingerprint"] == done["modelFingerprint"]

            # Refusals, each leaving the update open for a pull that is right.
            one = next(n for n in sorted(want) if want[n])
            with client.begin_update(name, fingerprint, device=0, source="pull") as upd:
                upd.pull_from({one: trainer.tensors[one]})
                out["pulledTwice"] = code(lambda: upd.pull_from(plan))
                raw = upd.conn.request
                out["daemonPulledTwice"] = code(lambda: raw("pull_by_plan", update=upd.id, plan=plan.id))
                out["daemonUnknownPlan"] = code(lambda: raw("pull_by_plan", update=upd.id, plan="0" * 32))
            foreign = subprocess.run([sys.executable, __file__, "pull_by_foreign_plan", client.socket_path, name, fingerprint, plan.id], capture_output=True, text=True, timeout=120)
            out["foreignPlan"] = foreign.stdout.strip().splitlines()[-1] if foreign.stdout.strip() else foreign.stderr[-400:]
            # A tensor the trainer moved: refused by the plan before anything is sent.
            moving = Moving(trainer.tensors[one].pointer, len(want[one]))
            with client.pull_plan(name, {one: moving}, device=0) as moved:
                moving.pointer += 256
                with client.begin_update(name, fingerprint, device=0, source="pull") as upd:
                    out["moved"] = code(lambda: upd.pull_from(moved))
            # A connection holds at most 4 plans; the fifth is refused by name, and a closed plan is gone.
            conn = Connection(client.socket_path)
            handle = plan._sources.handles[0]
            entry = [{"name": one, "source": 0, "offset": trainer.places[one], "bytes": len(want[one])}]
            opened = [conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=entry)["plan"] for _ in range(4)]
            out["fifthPlan"] = code(lambda: conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=entry))
            out["badName"] = code(lambda: client.conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=[{**entry[0], "name": "no.such.tensor"}]))
            out["badSize"] = code(lambda: client.conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=[{**entry[0], "bytes": entry[0]["bytes"] + 1}]))
            out["badDevice"] = code(lambda: client.conn.request("open_pull_plan", model=name, device="GPU-ffffffff-0000-0000-0000-000000000000", sources=[handle], tensors=entry))
            out["unknownModel"] = code(lambda: client.conn.request("open_pull_plan", model="no-such-model", device=DEVICE0, sources=[handle], tensors=entry))
            conn.close()
            with client.begin_update(name, fingerprint, device=0, source="pull") as upd:
                out["closedConnectionPlan"] = code(lambda: upd.conn.request("pull_by_plan", update=upd.id, plan=opened[0]))

            # A plan of more tensors than one request holds goes in parts (open_pull_plan's more):
            # the client's bound made small here, so the trainer's tensors take several.
            import weightd_client.pull as pull_module

            bound, split = pull_module._BATCH_BYTES, pull_module.batches
            sizes: list = []

            def counted(entries, handles):
                for b in split(entries, handles):
                    sizes.append(len(b[1]))
                    yield b

            pull_module._BATCH_BYTES, pull_module.batches = 4096, counted
            try:
                with client.pull_plan(name, trainer.tensors, device=0) as parted:
                    out["partedReply"] = [parted.reply["tensors"], "pending" in parted.reply, len(sizes) > 1, sum(sizes)]
                    new = step_bytes(3)
                    trainer.write(new)
                    with client.begin_update(name, fingerprint, device=0, source="pull") as upd:
                        got = upd.pull_from(parted)
                        done = upd.commit()
                    fingerprint = done["fingerprint"]
                    reader.switch_to(fingerprint)
                    out["parted"] = [got["pulled"] == len(want), reads(new)]
            finally:
                pull_module._BATCH_BYTES, pull_module.batches = bound, split
            # Its parts on the wire: another connection's plan, and a tensor an earlier part named,
            # are refused (the plan's earlier parts stay); the last part makes it; a part after that
            # names no plan being opened; a plan left in parts goes with its connection.
            conn = Connection(client.socket_path)
            other = next(n for n in sorted(want) if want[n] and n != one)
            two = [{"name": other, "source": 0, "offset": trainer.places[other], "bytes": len(want[other])}]
            first = conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=entry, more=True)
            out["partPending"] = [first.get("pending"), first["tensors"], "timings" in first]
            out["partOtherConnection"] = code(lambda: client.conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=two, plan=first["plan"]))
            out["partTwice"] = code(lambda: conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=entry, plan=first["plan"]))
            last = conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=two, plan=first["plan"])
            out["partMade"] = [last["plan"] == first["plan"], last["tensors"], "timings" in last]
            out["partAfterMade"] = code(lambda: conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=two, plan=first["plan"]))
            conn.request("open_pull_plan", model=name, device=DEVICE0, sources=[handle], tensors=entry, more=True)
            conn.close()
            plan.close()
            out["closedPlan"] = code(lambda: plan.check())
            reader.tensors = {}
            reader.detach()
            trainer.free()
        daemon.stop()
        sealed = [json.loads(line) for line in daemon.stderr_lines if '"update sealed' in line and json.loads(line).get("pulled")]
        # The plan's updates opened nothing and set nothing up: the plan did, once.
        out["planPullSetup"] = [[s["timings"]["pullTimings"][k] for k in ("openMs", "setupMs")] for s in sealed[:3]]
        out["planCommitNative"] = [s["timings"]["nativeMs"] for s in sealed[:3]]
        out["plansOpened"] = sum(1 for line in daemon.stderr_lines if '"pull plan opened' in line)
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    print(json.dumps(out))


def pull_by_foreign_plan(socket_path: str, name: str, base: str, plan: str) -> None:
    """Another process's update, naming a plan this one did not open: prints the daemon's code."""
    from weightd_client import WeightdClient

    with WeightdClient(socket_path) as client:
        with client.begin_update(name, base, device=0, source="pull") as upd:
            print(code(lambda: upd.conn.request("pull_by_plan", update=upd.id, plan=plan)), flush=True)


def pull_writer(socket_path: str, name: str, base: str) -> None:
    from test_host_fds import checkpoint_tensors
    from weightd_client import WeightdClient

    one = next(n for n, v in sorted(checkpoint_tensors().items()) if v)
    trainer = TrainerMemory({one: bytes(len(checkpoint_tensors()[one]))})
    with WeightdClient(socket_path) as client:
        upd = client.begin_update(name, base, device=0, source="pull")
        upd.pull_from(trainer.tensors)
        print("pulled", flush=True)
        sys.stdin.read()  # killed here


def daemon_ipc_update() -> None:
    """Legacy CUDA IPC handles: a writer is refused, and so is an attached engine's switch_to
    another version, by the flag it needs, before any descriptor is asked for and holding no lease."""
    import tempfile

    from daemon_fixture import Daemon
    from test_host_fds import MODEL
    from versions import other_version
    from weightd_client import expected_fingerprint
    from weightd_client.protocol import ServeError, WeightdError

    v1 = os.path.join(tempfile.mkdtemp(prefix="weightd-ipc-switch-"), "v1")
    other_version(MODEL, v1)
    e0, e1 = expected_fingerprint(MODEL, 1, 0), expected_fingerprint(v1, 1, 0)
    out = {}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "ipc", "--model", v1, "-tp", "1"]) as daemon:
        with daemon.client() as client:
            name = client.ping()["name"]
            try:
                client.begin_update(name, served_fingerprint(client, name, 0), device=0).abandon()
                out["refused"] = None
            except ServeError as err:
                out["refused"], out["message"] = err.code, str(err)
            attached = client.attach(e0.fingerprint, e0.fields, device=0, tensor_format="memoryview")
            try:
                attached.switch_to(e1.fingerprint, e1.fields)
                out["switchRefused"] = None
            except WeightdError as err:
                out["switchRefused"], out["switchMessage"] = err.code, str(err)
            out["leasesOnOther"] = len(client.stats(e1.fingerprint)["leases"])
            attached.tensors = {}
            attached.detach()
        daemon.stop()
    print(json.dumps(out))


def daemon_publish() -> None:
    """A processed layout published beside a cuda version (--cuda-handles fd) and mapped back
    read-only, byte for byte; a second publish of the key refused (docs/engines.md)."""
    import torch

    from daemon_fixture import Daemon
    from test_host_fds import MODEL
    from weightd_client.processed import Processed, lookup, publish, processed_key
    from weightd_client.protocol import ServeError

    out = {}
    computed = {"layer.weight#t": torch.arange(96, dtype=torch.float32).reshape(8, 12).to(torch.bfloat16), "layer.weight_scale": torch.tensor([0.25])}
    with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd"]) as daemon:
        with daemon.client() as client:
            name = client.ping()["name"]
            base = served_fingerprint(client, name, 0)
            fields = {"protocol": "processed-1", "base": base, "engine": "test", "engineVersion": "1", "processing": "M with K", "arch": "sm_90", "tp": "0/1", "params": "0" * 32}
            done = publish(client.socket_path, name, base, fields, computed, device=0)
            out["published"] = done["key"] == processed_key(fields)
            found = lookup(client.socket_path, base, processed_key(fields), tensor_format="memoryview", device=0)
            out["found"] = isinstance(found, Processed)
            out["readOnly"] = found.mapping.read_only
            out["sameBytes"] = all(
                ctypes.string_at(found.tensors[n].pointer, t.numel() * t.element_size()) == t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() for n, t in computed.items()
            )
            try:
                publish(client.socket_path, name, base, fields, computed, device=0)
                out["again"] = None
            except ServeError as err:
                out["again"] = err.code
            del found.tensors
            found.mapping.close()
            client.detach(found.lease)
        daemon.stop()
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    print(json.dumps(out))


def daemon_update_refused(segment_bytes: str = "") -> None:
    import tempfile

    from daemon_fixture import Daemon
    from test_host_fds import MODEL
    from weightd_client.protocol import ServeError

    args = ["--cuda-handles", "fd"]
    if segment_bytes:
        plan = os.path.join(tempfile.mkdtemp(prefix="weightd-cuda-refused-"), "plan.json")
        with open(plan, "w") as f:
            json.dump({"rules": [], "segmentBytes": int(segment_bytes)}, f)
        args += ["--plan-file", plan]
    out = {}
    with Daemon(MODEL, device="cuda", extra_args=args) as daemon:
        with daemon.client() as client:
            name = client.ping()["name"]
            held = vmm_fds(daemon.proc.pid)
            try:
                client.begin_update(name, served_fingerprint(client, name, 0), device=0).abandon()
                out["refused"] = None
            except ServeError as err:
                out["refused"], out["message"] = err.code, str(err)
            out["heldAfter"] = vmm_fds(daemon.proc.pid) - held
        daemon.stop()
        out["daemonLeaks"] = next((json.loads(l[len("FAKE_CUDA_LEAKS ") :]) for l in daemon.stderr.splitlines() if l.startswith("FAKE_CUDA_LEAKS ")), None)
    print(json.dumps(out))


def state(handle: str, segments=None, tensors=None) -> dict:
    return {
        "device": {"uuid": DEVICE0},
        "rank": {"globalRank": 0},
        "segments": segments or [{"segment": 0, "handle": handle, "bytes": SIZE}],
        "tensors": tensors or [{"name": "w", "dtype": "U8", "shape": [SIZE], "segment": 0, "offset": 0, "bytes": SIZE}],
        "aliases": {},
    }


def main() -> None:
    if sys.argv[1] == "export":
        return export()
    if sys.argv[1] == "export_fd":
        return export_fd()
    if sys.argv[1] == "daemon_fd":
        return daemon_fd()
    if sys.argv[1] == "daemon_switch":
        return daemon_switch()
    if sys.argv[1] == "daemon_update":
        return daemon_update()
    if sys.argv[1] == "daemon_switch_shared":
        return daemon_switch_shared()
    if sys.argv[1] == "update_writer":
        return update_writer(*sys.argv[2:5])
    if sys.argv[1] == "daemon_pull":
        return daemon_pull()
    if sys.argv[1] == "pull_locate":
        return pull_locate()
    if sys.argv[1] == "daemon_pull_prepared":
        return daemon_pull_prepared()
    if sys.argv[1] == "daemon_pull_prepare_refused":
        return daemon_pull_prepare_refused()
    if sys.argv[1] == "daemon_pull_context":
        return daemon_pull_context(sys.argv[2])
    if sys.argv[1] == "daemon_pull_releases_later":
        return daemon_pull_releases_later(sys.argv[2])
    if sys.argv[1] == "daemon_pull_plan":
        return daemon_pull_plan()
    if sys.argv[1] == "pull_by_foreign_plan":
        return pull_by_foreign_plan(*sys.argv[2:6])
    if sys.argv[1] == "pull_writer":
        return pull_writer(*sys.argv[2:5])
    if sys.argv[1] == "daemon_publish":
        return daemon_publish()
    if sys.argv[1] == "daemon_ipc_update":
        return daemon_ipc_update()
    if sys.argv[1] == "daemon_update_refused":
        return daemon_update_refused(*sys.argv[2:3])
    from weightd_client.cuda import CudaError, CudaMapping, _Driver

    case, handle = sys.argv[1:3]
    d = _Driver.get()

    def top():
        """Pops the current context: its address, or None when nothing was current."""
        ctx = ctypes.c_void_p()
        rc = d.cuCtxPopCurrent(ctypes.byref(ctx))
        assert rc in (0, E_INVALID_CONTEXT), rc
        return ctx.value if rc == 0 else None

    own = None
    if case != "no_caller_context":
        # The caller's own context, on another device, as a second library in the process has.
        own = ctypes.c_void_p()
        d.check(d.cuDevicePrimaryCtxRetain(ctypes.byref(own), 1), "retain")
        d.check(d.cuCtxPushCurrent(own), "push")
    out = {}
    if case.startswith("fd_"):
        # The descriptor as get_segment_fds would deliver it: a fresh one of the exporter's memory.
        fd = os.open(handle, os.O_RDWR | os.O_CLOEXEC)
        try:
            if case == "fd_write":
                # Maps, says whether read-only, then writes a byte as a kernel would: into a
                # read-only mapping that must fault here (SIGSEGV: the fake's device memory is
                # this process's mapping). A read-write one is left alone, since the exporter's
                # bytes are what the other cases read.
                mapping = CudaMapping(fd_state(), device=0, tensor_format="memoryview", segment_fds={0: fd})
                print(json.dumps({"readOnly": mapping.read_only}), flush=True)
                if mapping.read_only:
                    ctypes.memmove(mapping.pointers[0], b"\xff", 1)
                    print(json.dumps({"wrote": True}), flush=True)
                mapping.close()
                out["afterClose"] = top()
            elif case == "fd_restores":
                mapping = CudaMapping(fd_state(), device=0, tensor_format="memoryview", segment_fds={0: fd})
                os.close(fd)  # the mapping holds the memory without it
                fd = -1
                out["bytesOk"] = bytes(mapping.read(fd_state()["tensors"][0])) == FD_PATTERN
                out["afterAttach"] = top()
                if own is not None:
                    d.check(d.cuCtxPushCurrent(own), "push")
                mapping.close()
                mapping.close()
                out["afterClose"] = top()
            else:
                # fd_map_fails: the manifest claims more bytes than the descriptor's memory holds.
                # fd_missing: no descriptor was passed for the cuda-fd segment.
                try:
                    CudaMapping(fd_state(2 * FD_SIZE if case == "fd_map_fails" else FD_SIZE), device=0, tensor_format="memoryview", segment_fds={0: fd} if case == "fd_map_fails" else None)
                    out["error"] = None
                except CudaError as err:
                    out["error"], out["message"] = err.code, str(err)
                out["afterAttach"] = top()
        finally:
            if fd >= 0:
                os.close(fd)
    elif case == "view_outlives_close":
        # A view kept past close(): the handle stays open (the view still reads the bytes) and
        # the lease's end waits, until the view is freed.
        import gc

        mapping = CudaMapping(state(handle), device=0, tensor_format="memoryview")
        view, ended = mapping.tensors["w"], []
        mapping.close(then=lambda: ended.append(True))
        out["openWhileViewed"] = len(mapping.pointers)
        out["endedWhileViewed"] = bool(ended)
        out["bytesWhileViewed"] = ctypes.string_at(view.pointer, SIZE) == PATTERN  # the fake's device memory is host memory
        del view
        gc.collect()
        out["openAfter"] = len(mapping.pointers)
        out["endedAfter"] = bool(ended)
    elif case in ("restores", "no_caller_context"):
        mapping = CudaMapping(state(handle), device=0, tensor_format="memoryview")
        out["bytesOk"] = bytes(mapping.read(state(handle)["tensors"][0])) == PATTERN
        out["afterAttach"] = top()
        out["belowIt"] = top()
        if own is not None:
            d.check(d.cuCtxPushCurrent(own), "push")
        mapping.close()
        mapping.close()  # idempotent
        out["afterClose"] = top()
    else:
        bad = base64.b64encode(bytes(64)).decode()
        if case == "open_fails":
            st = state(handle, segments=[{"segment": 0, "handle": handle, "bytes": SIZE}, {"segment": 1, "handle": bad, "bytes": SIZE}])
        else:  # manifest_fails: every handle opens, then a tensor names a segment that does not exist
            st = state(handle, tensors=[{"name": "w", "dtype": "U8", "shape": [1], "segment": 7, "offset": 0, "bytes": 1}])
        try:
            CudaMapping(st, device=0, tensor_format="memoryview")
            out["error"] = None
        except CudaError as err:
            out["error"] = err.code
        out["afterAttach"] = top()
    out["own"] = own.value if own is not None else None
    if own is not None:
        d.check(d.cuDevicePrimaryCtxRelease(1), "release")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
