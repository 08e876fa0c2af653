#!/usr/bin/env python3
"""Same-run baselines for the fill benchmark, through PyTorch:
  - the host-to-device ceiling: a pinned 1 GiB tensor copied to each GPU (alone, then all GPUs
    at once), timed with CUDA events;
  - safetensors.torch.load_file(path, device="cuda:0") over every shard from a hot page cache,
    the way engines load weights without a cache daemon.

  python3 bench/gpu/baselines.py --ckpt DIR [--reps 2]
Prints one JSON line. GB/s are 1e9 bytes per second.
"""
import argparse
import glob
import json
import os
import time

import torch
from safetensors.torch import load_file


def pinned_h2d(devices, reps=10, size=1 << 30):
    srcs = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in devices]
    dsts = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{d}") for d in devices]
    for s, d in zip(srcs, dsts):
        d.copy_(s, non_blocking=True)
    for d in devices:
        torch.cuda.synchronize(d)
    t0 = time.perf_counter()
    for _ in range(reps):
        for s, d in zip(srcs, dsts):
            d.copy_(s, non_blocking=True)
    for d in devices:
        torch.cuda.synchronize(d)
    return reps * size * len(devices) / (time.perf_counter() - t0) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.ckpt, "*.safetensors")))
    total = sum(os.path.getsize(f) for f in files)
    n = torch.cuda.device_count()
    out = {"gpus": n, "gpuName": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "pinnedH2DGBps": pinned_h2d([0]), "pinnedH2DAllGpusGBps": pinned_h2d(list(range(n))) if n > 1 else None}
    runs = []
    for _ in range(a.reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loaded = [load_file(f, device="cuda:0") for f in files]
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
        del loaded
        torch.cuda.empty_cache()
    out["loadFileSeconds"] = runs
    out["loadFileBytes"] = total
    out["loadFileGBps"] = total / min(runs) / 1e9
    print(json.dumps(out))


if __name__ == "__main__":
    main()
