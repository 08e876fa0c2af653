#!/usr/bin/env python3
"""python3 bench/attach-once.py SOCKET_DIR [cuda|host]: one fresh process's first attach to rank 0,
the one a restarting engine pays, and a second one, timed inside it. torch is imported, and on
cuda its context made, before the clock starts, as an engine has them. Prints one JSON line:
firstMs (the call returned), firstUsableMs (and every view touched, through items(), as a
named_parameters-style consumer meets them), firstCpuMs (this process's CPU time for the
latter: what a busy machine's scheduling leaves out), secondMs, tensors. The client is whichever
weightd_client PYTHONPATH finds. With --wait, it says "ready" and waits for a line on stdin
before the clock starts (bench/attach-concurrent.py starts several at once that way)."""
import json
import sys
import time

import torch

if len(sys.argv) > 2 and sys.argv[2] == "cuda":
    torch.zeros(1, device="cuda:0")
from weightd_client import WeightdClient, find_socket  # noqa: E402

c = WeightdClient(find_socket(global_rank=0, socket_dir=sys.argv[1]))
fp = c.ping()["fingerprint"]
if "--wait" in sys.argv:
    print("ready", flush=True)
    sys.stdin.readline()
c0, t0 = time.process_time(), time.perf_counter()
a = c.attach(fp)
t1 = time.perf_counter()
n = sum(1 for _, t in a.tensors.items() if t.data_ptr() >= 0)
t1u, c1 = time.perf_counter(), time.process_time()
a.detach()
t2 = time.perf_counter()
b = c.attach(fp)
t3 = time.perf_counter()
b.detach()
print(json.dumps({"firstMs": (t1 - t0) * 1e3, "firstUsableMs": (t1u - t0) * 1e3, "firstCpuMs": (c1 - c0) * 1e3, "secondMs": (t3 - t2) * 1e3, "tensors": n}))
