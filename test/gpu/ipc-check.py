#!/usr/bin/env python3
"""An engine-side check of weightd's CUDA IPC export, from Python with nothing but ctypes.

  python3 test/gpu/ipc-check.py (--handle BASE64 | --fd N --bytes B) --plan plan.json [--device 0] [--samples 24]

Opens the exported segment with the driver's cuIpcOpenMemHandle (the call PyTorch's
cudaIpcOpenMemHandle makes), or, with --fd, a "cuda-fd" descriptor this process inherited with
the steps docs/protocol.md lists (cuMemImportFromShareableHandle, reserve, map, set access),
copies sampled tensors back with cuMemcpyDtoH and compares them with the bytes in the checkpoint
files. Prints one JSON line.
"""
import argparse
import base64
import ctypes
import json
import time


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", MemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


def open_fd(cuda, dev, fd, nbytes):
    """The protocol's steps for a cuda-fd segment; returns (pointer, undo) where undo unmaps it."""
    u64, size_t = ctypes.c_uint64, ctypes.c_size_t
    prop = AllocProp(type=1, requestedHandleTypes=1, location=MemLocation(1, dev.value))
    gran = size_t()
    checked(cuda, "cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), 0)
    unit = max(2 << 20, gran.value)
    size = size_t((nbytes + unit - 1) // unit * unit)
    handle, ptr = u64(), u64()
    checked(cuda, "cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), 1)
    checked(cuda, "cuMemAddressReserve", ctypes.byref(ptr), size, size_t(unit), u64(0), ctypes.c_ulonglong(0))
    checked(cuda, "cuMemMap", ptr, size, size_t(0), handle, ctypes.c_ulonglong(0))
    access = AccessDesc(location=MemLocation(1, dev.value), flags=3)
    checked(cuda, "cuMemSetAccess", ptr, size, ctypes.byref(access), size_t(1))

    def undo():
        checked(cuda, "cuMemUnmap", ptr, size)
        checked(cuda, "cuMemAddressFree", ptr, size)
        checked(cuda, "cuMemRelease", handle)

    return ptr, undo


def checked(lib, name, *args):
    fn = getattr(lib, name)
    r = fn(*args)
    if r != 0:
        s = ctypes.c_char_p()
        lib.cuGetErrorName(r, ctypes.byref(s))
        raise SystemExit(json.dumps({"ok": False, "error": f"{name} failed: {s.value.decode() if s.value else r}"}))


def samples(tensors, n):
    step = max(1, len(tensors) // n)
    picked = tensors[::step][:n]
    return picked if tensors[-1] in picked else picked[:-1] + [tensors[-1]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--handle")
    ap.add_argument("--fd", type=int)
    ap.add_argument("--bytes", type=int)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--samples", type=int, default=24)
    a = ap.parse_args()
    plan = json.load(open(a.plan))

    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), IpcHandle, ctypes.c_uint]
    cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    cuda.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    cuda.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
    checked(cuda, "cuInit", 0)
    dev = ctypes.c_int()
    checked(cuda, "cuDeviceGet", ctypes.byref(dev), a.device)
    ctx = ctypes.c_void_p()
    checked(cuda, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    checked(cuda, "cuCtxPushCurrent_v2", ctx)

    t0 = time.perf_counter()
    if a.fd is not None:
        ptr, close = open_fd(cuda, dev, a.fd, a.bytes)
    else:
        handle = IpcHandle.from_buffer_copy(base64.b64decode(a.handle))
        ptr = ctypes.c_uint64()
        checked(cuda, "cuIpcOpenMemHandle_v2", ctypes.byref(ptr), handle, 1)
        close = lambda: checked(cuda, "cuIpcCloseMemHandle", ptr.value)  # noqa: E731
    open_ms = (time.perf_counter() - t0) * 1000

    bad = []
    checked_bytes = 0
    picked = samples(plan["tensors"], a.samples)
    for t in picked:
        buf = ctypes.create_string_buffer(t["bytes"])
        checked(cuda, "cuMemcpyDtoH_v2", buf, ptr.value + t["offset"], t["bytes"])
        with open(t["path"], "rb") as f:
            f.seek(t["begin"])
            want = f.read(t["bytes"])
        if buf.raw != want:
            bad.append(t["name"])
        checked_bytes += t["bytes"]
    close()
    popped = ctypes.c_void_p()
    cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))
    cuda.cuDevicePrimaryCtxRelease_v2(dev)
    print(json.dumps({"ok": not bad, "handles": "fd" if a.fd is not None else "ipc", "openMs": open_ms, "tensors": len(picked), "checkedBytes": checked_bytes,
                      "mismatched": bad[:5]}))


if __name__ == "__main__":
    main()
