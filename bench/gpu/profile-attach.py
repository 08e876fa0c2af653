#!/usr/bin/env python3
# python3 bench/gpu/profile-attach.py SOCKET: with a daemon serving a rank on this GPU, splits a
# CUDA attach into get_state, the IPC open (and close) and the tensor views. Run from the repo root.
# Where does a CUDA attach of a large rank spend its time? get_state, the IPC open, the views.
import ctypes, json, sys, time, statistics, base64
sys.path.insert(0, 'clients/python')
import torch
from weightd_client import WeightdClient
from weightd_client import cuda as wc
path = sys.argv[1]
torch.cuda.init(); torch.zeros(1, device='cuda:0')
c = WeightdClient(path); fp = c.ping()['fingerprint']
out = {}
for rep in range(4):
    t0 = time.perf_counter(); st = c.get_state(fp); t1 = time.perf_counter()
    m = wc.CudaMapping(st, device=0) if hasattr(wc, 'CudaMapping') else None
    t2 = time.perf_counter()
    c.detach(st.get('leaseId'))
    if m: m.close()
    out.setdefault('get_state_ms', []).append(round((t1 - t0) * 1e3, 2)); out.setdefault('map_and_views_ms', []).append(round((t2 - t1) * 1e3, 2))
# The IPC open alone, and the views alone.
d = wc._Driver.get(); dev = d.device(0); ctx = ctypes.c_void_p(); d.check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), 'retain'); d.check(d.cuCtxSetCurrent(ctx), 'set')
st = c.get_state(fp)
for rep in range(3):
    h = wc._IpcHandle(); ctypes.memmove(ctypes.byref(h), base64.b64decode(st['segments'][0]['handle']), 64); p = ctypes.c_uint64()
    t0 = time.perf_counter(); d.check(d.cuIpcOpenMemHandle(ctypes.byref(p), h, 1), 'open'); t1 = time.perf_counter()
    d.check(d.cuIpcCloseMemHandle(p.value), 'close'); t2 = time.perf_counter()
    out.setdefault('ipc_open_ms', []).append(round((t1 - t0) * 1e3, 2)); out.setdefault('ipc_close_ms', []).append(round((t2 - t1) * 1e3, 2))
out['segmentBytes'] = st['segments'][0]['bytes']; out['tensors'] = len(st['tensors'])
print(json.dumps(out))
