#!/usr/bin/env python3
"""What the driver calls a cuda fill makes before its first read cost on this GPU (issue 29: the GPU
digests' fixed cost; issue 33: the fill's), each timed alone in a fresh context, 5 rounds:
  the digest kernel's module load (the fatbin beside the addon) and unload;
  the lanes' pinned staging: 16 slots of 2 MiB (the default 32 MiB budget), and one 32 MiB block;
  a digest job table's device memory (two small cuMemAlloc) and its upload through pinned memory;
  16 streams and 32 events (a lane's per member).
Prints one JSON line of medians in milliseconds.
  python3 bench/gpu/fill-setup-probe.py [FATBIN]   (default build/Release/weightd-digests.fatbin)
"""
import ctypes
import json
import statistics
import sys
import time

MiB = 1 << 20
lib = ctypes.CDLL("libcuda.so.1")
u64 = ctypes.c_uint64
vp = ctypes.c_void_p


def check(rc, what):
    if rc != 0:
        raise SystemExit(f"{what} failed: CUresult {rc}")


def timed(fn, rounds=5):
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(out), 3)


def main():
    fatbin = sys.argv[1] if len(sys.argv) > 1 else "build/Release/weightd-digests.fatbin"
    image = open(fatbin, "rb").read()
    check(lib.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), vp()
    check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
    buf = ctypes.create_string_buffer(image)

    def module():
        m = vp()
        check(lib.cuModuleLoadData(ctypes.byref(m), buf), "cuModuleLoadData")
        f = vp()
        # native/gpu_digest_job.h WEIGHTD_HASH_KERNEL
        check(lib.cuModuleGetFunction(ctypes.byref(f), m, b"weightd_xxh3_pieces_j32"), "cuModuleGetFunction")
        check(lib.cuModuleUnload(m), "cuModuleUnload")

    def pinned(n, size):
        def run():
            ptrs = []
            for _ in range(n):
                p = vp()
                check(lib.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), 1), "cuMemHostAlloc")  # PORTABLE
                ptrs.append(p)
            for p in ptrs:
                check(lib.cuMemFreeHost(p), "cuMemFreeHost")
        return run

    def table():
        a, b, s, h = u64(), u64(), vp(), vp()
        check(lib.cuMemAlloc_v2(ctypes.byref(a), ctypes.c_size_t(8192 * 24)), "cuMemAlloc")
        check(lib.cuMemAlloc_v2(ctypes.byref(b), ctypes.c_size_t(8192 * 16)), "cuMemAlloc")
        check(lib.cuMemHostAlloc(ctypes.byref(h), ctypes.c_size_t(8192 * 24), 0), "cuMemHostAlloc")
        check(lib.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
        check(lib.cuMemcpyHtoDAsync_v2(a, h, ctypes.c_size_t(8192 * 24), s), "cuMemcpyHtoDAsync")
        check(lib.cuStreamSynchronize(s), "cuStreamSynchronize")
        check(lib.cuStreamDestroy_v2(s), "cuStreamDestroy")
        check(lib.cuMemFreeHost(h), "cuMemFreeHost")
        check(lib.cuMemFree_v2(a), "cuMemFree")
        check(lib.cuMemFree_v2(b), "cuMemFree")

    def streams_events():
        ss, es = [], []
        for _ in range(16):
            s = vp()
            check(lib.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
            ss.append(s)
        for _ in range(32):
            e = vp()
            check(lib.cuEventCreate(ctypes.byref(e), 2), "cuEventCreate")  # DISABLE_TIMING
            es.append(e)
        for e in es:
            check(lib.cuEventDestroy_v2(e), "cuEventDestroy")
        for s in ss:
            check(lib.cuStreamDestroy_v2(s), "cuStreamDestroy")

    first_module = timed(module, 1)
    out = {
        "moduleFirstMs": first_module,
        "moduleMs": timed(module),
        "pinned16x2MiBMs": timed(pinned(16, 2 * MiB)),
        "pinned1x32MiBMs": timed(pinned(1, 32 * MiB)),
        "pinned1x192KiBMs": timed(pinned(1, 192 * 1024)),
        "jobTableMs": timed(table),
        "streams16Events32Ms": timed(streams_events),
        "fatbinBytes": len(image),
    }
    print(json.dumps(out), flush=True)
    lib.cuCtxPopCurrent_v2(None)
    lib.cuDevicePrimaryCtxRelease_v2(dev)


if __name__ == "__main__":
    main()
