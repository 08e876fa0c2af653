#!/usr/bin/env python3
"""python3 bench/attach-once.py SOCKET_DIR [cuda|host]: one fresh process's first attach to rank 0,
the one a restarting engine pays, and a second one, timed inside it. torch is imported, and on
cuda its context made, before the clock starts, as an engine has them. Prints one JSON line:
firstMs, secondMs, tensors. The client is whichever weightd_client PYTHONPATH finds."""
import json
import sys
import time

import torch

if len(sys.argv) > 2 and sys.argv[2] == "cuda":
    torch.zeros(1, device="cuda:0")
from weightd_client import WeightdClient, find_socket  # noqa: E402

c = WeightdClient(find_socket(global_rank=0, socket_dir=sys.argv[1]))
fp = c.ping()["fingerprint"]
t0 = time.perf_counter()
a = c.attach(fp)
t1 = time.perf_counter()
n = len(a.tensors)
a.detach()
t2 = time.perf_counter()
b = c.attach(fp)
t3 = time.perf_counter()
b.detach()
print(json.dumps({"firstMs": (t1 - t0) * 1e3, "secondMs": (t3 - t2) * 1e3, "tensors": n}))
