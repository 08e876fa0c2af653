#!/usr/bin/env python3
"""Writes what a rank's arena must hold, computed independently of weightd's copy ops.

  python3 test/gpu/expected-slices.py --plan rank0.json --out rank0.bin [--plan ... --out ...]

For each tensor of the plan (bench/gpu/rankPlans.mjs: the daemon's plan with, per tensor, its
file, data range, shape, dtype, split dim, tp, rank, arena offset) numpy maps the tensor from its file and takes the rank's part with
np.array_split along the split dim, the way torch.chunk/tensor_split cut it; the bytes go at the
tensor's arena offset. gpu-check.mjs then compares the GPU arena with this file.
"""
import argparse
import json
import time

import numpy as np

# Element containers by width: slicing moves whole elements, so the bit pattern is all that matters.
BY_BITS = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
BITS = {"BF16": 16, "F16": 16, "F32": 32, "F64": 64, "I8": 8, "U8": 8, "I16": 16, "I32": 32, "I64": 64,
        "F8_E4M3": 8, "F8_E5M2": 8, "BOOL": 8, "U16": 16, "U32": 32, "U64": 64}


def write_expected(plan_path, out_path):
    plan = json.load(open(plan_path))
    with open(out_path, "wb") as out:
        out.truncate(plan["segmentBytes"])
        for t in plan["tensors"]:
            whole = np.memmap(t["path"], dtype=BY_BITS[BITS[t["dtype"]]], mode="r", offset=t["begin"],
                              shape=tuple(t["shape"]))
            part = whole if t["dim"] is None else np.array_split(whole, t["tp"], axis=t["dim"])[t["rank"]]
            data = np.ascontiguousarray(part).tobytes()
            if len(data) != t["bytes"]:
                raise SystemExit(f"{t['name']}: numpy's slice has {len(data)} bytes, the plan says {t['bytes']}")
            out.seek(t["offset"])
            out.write(data)
    return len(plan["tensors"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", action="append", required=True)
    ap.add_argument("--out", action="append", required=True)
    a = ap.parse_args()
    t0 = time.perf_counter()
    tensors = sum(write_expected(p, o) for p, o in zip(a.plan, a.out))
    print(json.dumps({"tensors": tensors, "seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
