#!/usr/bin/env python3
"""What a version's segments cost the driver to let go of and to remap, on a GPU (issue 31): for
N segments of S MiB made as the daemon makes them (cuMemCreate, exported as POSIX descriptors,
the handles released, so only the descriptors hold the memory), timed with time.perf_counter:

  closeLastMs   close() of the last descriptor of each (the driver frees the memory inside it:
                an update whose version repeats a served one discards its finals so);
  closeDupMs    close() of a duplicate while another descriptor holds the memory;
  unmapEachMs   cuMemUnmap per segment of N contiguous mappings in one reserved range;
  unmapRunRc    cuMemUnmap of the whole run in one call: 0 where the driver takes a range over
                several mappings (then unmapRunMs), else its error;
  mapEachMs     cuMemMap per segment at the same addresses, then setAccessRunMs for one
                cuMemSetAccess over the run.

  python3 bench/gpu/vmm-release-probe.py [N] [S_MIB] [REPS]    (default 83 100 3)
Prints one JSON line. Needs weightd_client on PYTHONPATH (its ctypes structures) and libcuda.
"""
import ctypes
import json
import os
import statistics
import sys
import time

from weightd_client.cuda import (
    CU_MEM_ACCESS_FLAGS_PROT_READ,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM,
    CU_MEM_ALLOCATION_TYPE_PINNED,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    CU_MEM_LOCATION_TYPE_DEVICE,
    _AccessDesc,
    _AllocProp,
    _Driver,
    _MemLocation,
)

n, mib, reps = [int(a) for a in sys.argv[1:4]] + [83, 100, 3][len(sys.argv[1:4]) :]
d = _Driver.get()
lib = d.lib
u64, size = ctypes.c_uint64, ctypes.c_size_t
lib.cuMemCreate.argtypes = [ctypes.POINTER(u64), size, ctypes.POINTER(_AllocProp), ctypes.c_ulonglong]
lib.cuMemExportToShareableHandle.argtypes = [ctypes.c_void_p, u64, ctypes.c_int, ctypes.c_ulonglong]
dev = d.device(0)
ctx = ctypes.c_void_p()
d.check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
d.check(d.cuCtxPushCurrent(ctx), "push")
prop = _AllocProp(type=CU_MEM_ALLOCATION_TYPE_PINNED, requestedHandleTypes=CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, location=_MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, dev))
gran = size()
d.check(d.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity")
seg = (mib << 20) // gran.value * gran.value


def made():
    """n exported segments whose handles are released: only their descriptors hold them."""
    fds = []
    for _ in range(n):
        h, fd = u64(), ctypes.c_int()
        d.check(lib.cuMemCreate(ctypes.byref(h), seg, ctypes.byref(prop), 0), "cuMemCreate")
        d.check(lib.cuMemExportToShareableHandle(ctypes.byref(fd), h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "export")
        d.check(d.cuMemRelease(h.value), "release")
        fds.append(fd.value)
    return fds


def timed(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1e3


out = {"segments": n, "segmentBytes": seg, "closeLastMs": [], "closeDupMs": [], "unmapEachMs": [], "unmapRunMs": [], "mapEachMs": [], "setAccessRunMs": []}
for _ in range(reps):
    fds = made()
    dups = [os.dup(fd) for fd in fds]
    out["closeDupMs"].append(timed(lambda: [os.close(fd) for fd in dups]))
    out["closeLastMs"].append(timed(lambda: [os.close(fd) for fd in fds]))
    # A reserved range with every segment mapped, as a client's mapping holds a version.
    fds = made()
    handles = []
    for fd in fds:
        h = u64()
        d.check(d.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), "import")
        handles.append(h.value)
        os.close(fd)
    base = u64()
    d.check(d.cuMemAddressReserve(ctypes.byref(base), seg * n, gran.value, 0, 0), "reserve")
    at = [base.value + i * seg for i in range(n)]
    access = _AccessDesc(location=_MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, dev), flags=CU_MEM_ACCESS_FLAGS_PROT_READ)

    def map_each():
        for p, h in zip(at, handles):
            d.check(d.cuMemMap(p, seg, 0, h, 0), "map")

    out["mapEachMs"].append(timed(map_each))
    out["setAccessRunMs"].append(timed(lambda: d.check(d.cuMemSetAccess(base.value, seg * n, ctypes.byref(access), 1), "access")))
    out["unmapEachMs"].append(timed(lambda: [d.check(d.cuMemUnmap(p, seg), "unmap") for p in at]))
    map_each()
    d.check(d.cuMemSetAccess(base.value, seg * n, ctypes.byref(access), 1), "access")
    t = time.perf_counter()
    rc = d.cuMemUnmap(base.value, seg * n)
    out["unmapRunRc"] = rc
    if rc == 0:
        out["unmapRunMs"].append((time.perf_counter() - t) * 1e3)
    else:
        for p in at:
            d.cuMemUnmap(p, seg)
    d.check(d.cuMemAddressFree(base.value, seg * n), "free range")
    for h in handles:
        d.check(d.cuMemRelease(h), "release")
summary = {k: (round(statistics.median(v), 3) if isinstance(v, list) and v else v) for k, v in out.items()}
summary["runs"] = {k: [round(x, 3) for x in v] for k, v in out.items() if isinstance(v, list)}
print(json.dumps(summary))
