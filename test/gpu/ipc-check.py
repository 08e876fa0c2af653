#!/usr/bin/env python3
"""An engine-side check of weightd's CUDA IPC export, from Python with nothing but ctypes.

  python3 test/gpu/ipc-check.py --handle BASE64 --plan plan.json [--device 0] [--samples 24]

Opens the exported segment with the driver's cuIpcOpenMemHandle (the call PyTorch's
cudaIpcOpenMemHandle makes), copies sampled tensors back with cuMemcpyDtoH and compares them
with the bytes in the checkpoint files. Prints one JSON line.
"""
import argparse
import base64
import ctypes
import json
import time


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


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
    ap.add_argument("--handle", required=True)
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

    handle = IpcHandle.from_buffer_copy(base64.b64decode(a.handle))
    ptr = ctypes.c_uint64()
    t0 = time.perf_counter()
    checked(cuda, "cuIpcOpenMemHandle_v2", ctypes.byref(ptr), handle, 1)
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
    checked(cuda, "cuIpcCloseMemHandle", ptr.value)
    popped = ctypes.c_void_p()
    cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))
    cuda.cuDevicePrimaryCtxRelease_v2(dev)
    print(json.dumps({"ok": not bad, "openMs": open_ms, "tensors": len(picked), "checkedBytes": checked_bytes,
                      "mismatched": bad[:5]}))


if __name__ == "__main__":
    main()
