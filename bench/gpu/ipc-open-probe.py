#!/usr/bin/env python3
# python3 bench/gpu/ipc-open-probe.py: allocates (and fills) device memory in this process and
# times cuIpcOpenMemHandle of it from child processes: one large segment vs several, in
# sequence or in threads, with and without torch initialised in the child.
# Experiment: does cuIpcOpenMemHandle time scale with allocation size, and do parallel opens of
# several smaller segments (threads) beat one large one?
import ctypes, json, subprocess, sys, threading, time
cuda = ctypes.CDLL('libcuda.so.1')
class H(ctypes.Structure):
    _fields_ = [('reserved', ctypes.c_char * 64)]
def ck(r, what):
    if r != 0: raise SystemExit(f'{what} failed: {r}')
def ctx0():
    ck(cuda.cuInit(0), 'init'); dev = ctypes.c_int(); ck(cuda.cuDeviceGet(ctypes.byref(dev), 0), 'dev')
    ctx = ctypes.c_void_p(); ck(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), 'retain'); ck(cuda.cuCtxSetCurrent(ctx), 'cur'); return ctx
if len(sys.argv) > 1 and sys.argv[1] == 'open':
    if sys.argv[2] == 'torch':
        import torch; torch.zeros(1, device='cuda:0'); sys.argv[2] = 'seq'
    ctx = ctx0(); mode = sys.argv[2]; hs = [bytes.fromhex(x) for x in sys.argv[3:]]
    def op(hb, out):
        cuda.cuCtxSetCurrent(ctx); h = H.from_buffer_copy(hb); p = ctypes.c_uint64()
        r = cuda.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, ctypes.c_uint(1))
        out.append(p.value if r == 0 else ('error', r))
    res = []
    for trial in range(3):
        out = []; t0 = time.perf_counter()
        if mode == 'seq':
            for hb in hs: op(hb, out)
        else:
            ts = [threading.Thread(target=op, args=(hb, out)) for hb in hs]; [t.start() for t in ts]; [t.join() for t in ts]
        res.append((time.perf_counter() - t0) * 1000)
        bad = [p for p in out if isinstance(p, tuple)]
        if bad or len(out) != len(hs): raise SystemExit(f'open errors {bad} {len(out)}')
        for p in out: ck(cuda.cuIpcCloseMemHandle(ctypes.c_uint64(p)), 'close')
    print(json.dumps({'mode': mode, 'n': len(hs), 'ms': [round(x, 2) for x in res]}))
    sys.exit(0)
ctx0()
def alloc(n):
    p = ctypes.c_uint64(); ck(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), 'alloc')
    ck(cuda.cuMemsetD8_v2(p, ctypes.c_ubyte(7), ctypes.c_size_t(n)), 'memset'); ck(cuda.cuCtxSynchronize(), 'sync')
    h = H(); ck(cuda.cuIpcGetMemHandle(ctypes.byref(h), p), "get"); return bytes(h).hex()
G = 1 << 30
one8 = alloc(8 * G); four2 = [alloc(2 * G) for _ in range(4)]; one1 = alloc(1 * G); eight1 = [alloc(1 * G) for _ in range(8)]
for args in [['seq', one8], ['torch', one8], ['torch', one1], ['torch'] + four2]:
    r = subprocess.run([sys.executable, __file__, 'open'] + args, capture_output=True, text=True)
    print(r.stdout.strip() or ('err ' + r.stderr[-300:]), flush=True)
