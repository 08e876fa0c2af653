#!/usr/bin/env python3
"""What one torch view costs, made 50k at once by unbind as the client makes them, with and
without autograd's view tracking: thread CPU (best of 5, each into new memory: the 5 results are
kept, so no round reuses another's pages, as in a fresh process) and the new memory per view (the
process's minor page faults x 4 KiB / 50k). Also the other ways of making 50k views, below the
tracking, and inference_mode. Run: python3 views-floor.py (torch imported)."""
import contextlib
import gc
import json
import resource
import time

import torch

N = 50_000
gc.disable()
base = torch.empty(1 << 22, dtype=torch.uint8).view(torch.bfloat16)
stacked = base[: N * 16].as_strided((N, 4, 4), (16, 4, 1), 0)
flat = base[: N * 16]
below = torch._C._AutoDispatchBelowADInplaceOrView
kept = []


def measure(name, make, guard=contextlib.nullcontext):
    best, faults = 1e9, None
    for _ in range(5):
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.thread_time()
        with guard():
            views = make()
        t, f = time.thread_time() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        kept.append(views)
        best, faults = min(best, t), faults if faults is not None else f
    v = views[1]
    print(json.dumps({"how": name, "bestMs": round(best * 1e3, 2), "usPerView": round(best * 1e6 / N, 3), "bytesPerView": round(faults * 4096 / N), "isView": v._is_view(), "isInference": v.is_inference()}))


measure("unbind", lambda: stacked.unbind(0))
measure("unbind, below autograd", lambda: stacked.unbind(0), below)
measure("unbind, inference_mode", lambda: stacked.unbind(0), torch.inference_mode)
measure("split(16), below autograd", lambda: flat.split(16), below)
measure("as_strided per view, below autograd", lambda: [flat.as_strided((4, 4), (4, 1), 16 * i) for i in range(N)], below)
