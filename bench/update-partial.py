#!/usr/bin/env python3
"""A writer's update of one layer, full copy against partial (shared segments), paired in one run.

  python3 bench/update-partial.py --out DIR [--model DIR] [--gib 1] [--segment-mib 64]
                                  [--layer 0] [--runs 5] [--device host]

Starts one daemon (dist/main.js) on a Llama-shaped checkpoint (written by bench/llamaCheckpoint.ts
when --model does not hold one), its arena cut into segments of about --segment-mib MiB by a plan
file (segmentBytes), with --keep-versions 0 so each committed version's base drains. Each run
writes layer --layer's tensors twice, in alternating order: once through begin_update with no
tensors named (every segment copied) and once naming them (only their segments copied, the rest
shared with the base). Each commit writes other bytes, so each is a new version. Writes one JSON
line per update to DIR/updates.jsonl (begin, write and commit seconds, segments copied), the
daemon's log to DIR/daemon.log, and prints the medians and the median paired difference.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "clients" / "python"), str(REPO / "clients" / "python" / "tests")]

from daemon_fixture import Daemon  # noqa: E402

WRITE_CHECKPOINT = """
const { writeLlamaCheckpoint } = await import('./dist/bench/llamaCheckpoint.js');
console.log(await writeLlamaCheckpoint(process.argv[1], Number(process.argv[2])));
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="a folder that must not exist")
    p.add_argument("--model", help="checkpoint folder (written if it holds none; default DIR/model)")
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--segment-mib", type=int, default=64)
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--device", default="host")
    return p.parse_args()


def one_update(client, name, base, tensors, fill, partial):
    t0 = time.perf_counter()
    upd = client.begin_update(name, base, tensors=tensors if partial else None)
    t1 = time.perf_counter()
    segments = len(upd._maps)
    for t in tensors:
        upd.tensor(t).view("uint8")[...] = fill
    t2 = time.perf_counter()
    done = upd.commit()
    t3 = time.perf_counter()
    return done, {"mode": "partial" if partial else "full", "begin_s": t1 - t0, "write_s": t2 - t1, "commit_s": t3 - t2, "total_s": t3 - t0 - (t2 - t1), "segments_copied": segments}


def main():
    a = parse_args()
    out = Path(a.out)
    out.mkdir(parents=True)
    model = Path(a.model or out / "model")
    size = subprocess.run(["node", "--input-type=module", "-e", WRITE_CHECKPOINT, str(model), str(a.gib)], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()
    plan = out / "plan.json"
    plan.write_text(json.dumps({"rules": [], "segmentBytes": a.segment_mib << 20}))
    with Daemon(str(model), ["--plan-file", str(plan), "--keep-versions", "0"], device=a.device) as daemon, daemon.client(0) as client, open(out / "updates.jsonl", "x") as log:
        served = next(v for v in client.ping()["models"] if v["status"] == "serving")
        name, base = served["name"], served["fingerprint"]
        prefix = f"model.layers.{a.layer}."
        with client.begin_update(name, base) as probe:
            tensors = sorted(t for t in probe.tensors if t.startswith(prefix))
            segments = len(probe._maps)
            layer_bytes = sum(probe.tensors[t]["bytes"] for t in tensors)
        print(f"{name}: {size} tensor bytes in {segments} segments; layer {a.layer}: {len(tensors)} tensors, {layer_bytes} bytes", flush=True)
        rows = []
        try:
            run_pairs(client, name, base, tensors, a.runs, rows, log)
        finally:
            (out / "daemon.log").write_text("".join(daemon.stderr_lines))
    for r in rows:
        r.update(segments=segments, layer_bytes=layer_bytes)
    by = {m: [r["total_s"] for r in rows if r["mode"] == m] for m in ("full", "partial")}
    paired = [f - p for f, p in zip(by["full"], by["partial"])]
    print(f"begin+commit median: full {statistics.median(by['full']):.3f} s, partial {statistics.median(by['partial']):.3f} s; paired full - partial median {statistics.median(paired):.3f} s")


def run_pairs(client, name, base, tensors, runs, rows, log):
    """Each run: a full and a partial update of the layer, in alternating order; each commit's base is the previous commit."""
    fill = 1
    for run in range(runs):
        for partial in ([False, True] if run % 2 == 0 else [True, False]):
            done, row = one_update(client, name, base, tensors, fill, partial)
            fill = fill % 255 + 1
            base = done["fingerprint"]
            row.update(run=run, version=done["version"])
            log.write(json.dumps(row) + "\n")
            rows.append(row)
            print(json.dumps(row), flush=True)

if __name__ == "__main__":
    main()
