#!/usr/bin/env python3
# python3 bench/gpu/first-attach-profile.py SOCKET_DIR [DEVICE]: where the first attach of a
# fresh process goes, against the second (bench/RESULTS.md: the first is ~10 ms slower on every
# size). The process has torch and its CUDA context (as an engine has) before the clock starts;
# the first attach runs under cProfile (its own time is printed apart, unprofiled runs after).
import cProfile, io, json, pstats, sys, time
sys.path.insert(0, "clients/python")
import torch
from weightd_client import WeightdClient, find_socket

socket_dir = sys.argv[1]
device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
if device == "cuda":
    torch.cuda.init()
    torch.zeros(1, device="cuda:0")
client = WeightdClient(find_socket(global_rank=0, socket_dir=socket_dir))
fp = client.ping()["fingerprint"]
prof = cProfile.Profile()
t0 = time.perf_counter()
prof.enable()
att = client.attach(fp, device=0) if device == "cuda" else client.attach(fp)
prof.disable()
first = (time.perf_counter() - t0) * 1e3
att.detach()
later = []
for _ in range(3):
    t0 = time.perf_counter()
    att = client.attach(fp, device=0) if device == "cuda" else client.attach(fp)
    later.append(round((time.perf_counter() - t0) * 1e3, 2))
    att.detach()
text = io.StringIO()
pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
print(json.dumps({"firstProfiledMs": round(first, 2), "laterMs": later, "tensors": len(att.state["tensors"])}))
print(text.getvalue())
