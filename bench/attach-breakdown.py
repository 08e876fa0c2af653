#!/usr/bin/env python3
"""python3 bench/attach-breakdown.py SOCKET_DIR [cuda|host]: where one fresh process's first
attach to rank 0 spends its time, by wrapping the client's own steps: waiting for and reading
the reply (recv), decoding its JSON (json), checking the columns (columns) or decoding the packed
manifest (packed, a client that asks for it), making the views (views), and the whole attach
(total). Each step also with this thread's CPU time (``<step>Cpu``) and the process's minor page
faults (``<step>Faults``: a fresh process pays one per new 4 KiB page). Then the floor of the views
step: one bare ``as_strided``
per tensor of a byte tensor's typed view, as many as the attach made, the collector paused as
the attach pauses it. torch is imported, and on cuda its context made, before the clock starts.
Prints one JSON line (ms). The client is whichever weightd_client PYTHONPATH finds."""
import gc
import json
import resource
import sys
import time

import torch

device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
if device == "cuda":
    torch.zeros(1, device="cuda:0")
import weightd_client.columns as columns  # noqa: E402
import weightd_client.cuda as cuda  # noqa: E402
import weightd_client.host as host  # noqa: E402
import weightd_client.protocol as protocol  # noqa: E402
from weightd_client import WeightdClient, find_socket  # noqa: E402

ms = {}


def now():
    return time.perf_counter() * 1e3, time.thread_time() * 1e3, resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed(owner, name, key):
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = now()
        try:
            return inner(*args, **kwargs)
        finally:
            for k, a, b in zip((key, key + "Cpu", key + "Faults"), t, now()):
                ms[k] = ms.get(k, 0.0) + b - a

    setattr(owner, name, wrapper)


timed(protocol, "_recv_exact", "recv")
timed(protocol.json, "loads", "json")
timed(columns.TensorColumns, "__init__", "columns")
import weightd_client.client as client_module  # noqa: E402

if hasattr(client_module, "unpack_manifest"):  # a client that asks for the packed manifest
    timed(client_module, "unpack_manifest", "packed")
timed(host if device == "host" else cuda, "torch_by_name", "views")

c = WeightdClient(find_socket(global_rank=0, socket_dir=sys.argv[1]))
fp = c.ping()["fingerprint"]
ms.clear()
t0 = now()
a = c.attach(fp)
t1 = now()
n = sum(1 for _, t in a.tensors.items() if t.data_ptr() >= 0)  # every view used, as bench/attach-once.py uses them
t2 = now()
for key, (x, y) in (("total", (t0, t1)), ("touch", (t1, t2))):
    for k, a_, b in zip((key, key + "Cpu", key + "Faults"), x, y):
        ms[k] = b - a_
a.detach()

base = torch.empty(1 << 20, dtype=torch.uint8, device=device if device == "cuda" else "cpu").view(torch.bfloat16)
gc.disable()
t = time.perf_counter()
views = [base.as_strided((16, 16), (16, 1), 256 * (i % 2048)) for i in range(n)]
ms["bareViewsFloor"] = (time.perf_counter() - t) * 1e3
gc.enable()
print(json.dumps({"tensors": n, **{k: round(v, 2) for k, v in ms.items()}}))
