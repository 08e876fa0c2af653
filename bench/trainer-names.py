#!/usr/bin/env python3
"""A trainer's write of one layer by checkpoint names against the same values by vLLM's names
(fused qkv_proj and gate_up_proj, split by the daemon's vllm layout: engine_names.py), paired in
one run, and the step engine names add to every write_version: reading the rank's manifests
(EngineNames.of_rank: the checkpoint layout, and the vllm layout when a name is not a checkpoint one).

  python3 bench/trainer-names.py --out DIR [--model DIR] [--gib 0.25] [--layer 0] [--runs 7]

Starts one daemon (dist/main.js, host) with --layouts checkpoint,vllm and --keep-versions 0 on a
Llama-shaped checkpoint (bench/llamaCheckpoint.ts when --model holds none). Each run writes layer
--layer's attention and MLP weights both ways, in alternating order, other values each time (so
each commit is a new version), and times EngineNames.of_rank alone for either set of names. Writes
one JSON line per measurement to DIR/writes.jsonl, the load average before and after to
DIR/loadavg.txt, and prints the medians.
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
PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="a folder that must not exist")
    p.add_argument("--model", help="checkpoint folder (written if it holds none; default DIR/model)")
    p.add_argument("--gib", type=float, default=0.25)
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--runs", type=int, default=7)
    return p.parse_args()


def main():
    import torch

    from weightd_client.engine_names import EngineNames
    from weightd_client.write_version import WriteTarget, serving_fingerprint, write_version

    a = parse_args()
    out = Path(a.out)
    out.mkdir(parents=True)
    loadavg = [f"before {Path('/proc/loadavg').read_text().strip()}"]
    model = Path(a.model or out / "model")
    size = subprocess.run(["node", "--input-type=module", "-e", WRITE_CHECKPOINT, str(model), str(a.gib)], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()
    rows = []
    with Daemon(str(model), ["--layouts", "checkpoint,vllm", "--keep-versions", "0"]) as daemon, open(out / "writes.jsonl", "x") as log:
        with daemon.client(0) as client:
            name = next(v["name"] for v in client.ping()["models"] if v["status"] == "serving")
            base = client.copy(serving_fingerprint(client, name), tensor_format="torch")
        pre = f"model.layers.{a.layer}."
        ckpt = {n: t.clone() for n, t in base.items() if n.startswith(pre) and (".self_attn." in n or ".mlp." in n)}
        del base
        target = WriteTarget(name, socket_dir=daemon.socket_dir)
        print(f"{name}: {size}; layer {a.layer}: {len(ckpt)} tensors, {sum(t.nbytes for t in ckpt.values())} bytes", flush=True)

        def by_vllm(values):
            out, taken = {}, set()
            for fused, parts in PARTS.items():
                for n in values:
                    if f".{parts[0]}." in n:
                        names = [n.replace(parts[0], p) for p in parts]
                        out[n.replace(parts[0], fused)] = torch.cat([values[m] for m in names])
                        taken.update(names)
            out.update({n: t for n, t in values.items() if n not in taken})
            return out

        fill = 1
        try:
            for run in range(a.runs):
                for mode in (["checkpoint", "vllm"] if run % 2 == 0 else ["vllm", "checkpoint"]):
                    values = {n: torch.full_like(t, fill) for n, t in ckpt.items()}
                    fill = fill % 100 + 1
                    pairs = list((by_vllm(values) if mode == "vllm" else values).items())
                    metadata = [(n, t.dtype, tuple(t.shape)) for n, t in pairs]
                    with daemon.client(0) as client:
                        fp = serving_fingerprint(client, name)
                        t0 = time.perf_counter()
                        EngineNames.of_rank(client, name, fp, metadata)
                        names_s = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    info = write_version(iter(pairs), target, metadata)
                    row = {"run": run, "mode": mode, "tensors": len(pairs), "write_version_s": time.perf_counter() - t0, "engine_names_s": names_s, "version": info["version"]}
                    log.write(json.dumps(row) + "\n")
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            (out / "daemon.log").write_text("".join(daemon.stderr_lines))
    loadavg.append(f"after {Path('/proc/loadavg').read_text().strip()}")
    (out / "loadavg.txt").write_text("\n".join(loadavg) + "\n")
    med = {m: {k: statistics.median(r[k] for r in rows if r["mode"] == m) for k in ("write_version_s", "engine_names_s")} for m in ("checkpoint", "vllm")}
    by_run = {(r["run"], r["mode"]): r["write_version_s"] for r in rows}
    paired = [by_run[(r, "vllm")] - by_run[(r, "checkpoint")] for r in range(a.runs)]
    summary = (
        f"write_version median: checkpoint names {med['checkpoint']['write_version_s'] * 1e3:.1f} ms, vllm names {med['vllm']['write_version_s'] * 1e3:.1f} ms; "
        f"paired vllm - checkpoint median {statistics.median(paired) * 1e3:.1f} ms\n"
        f"EngineNames.of_rank median: checkpoint names {med['checkpoint']['engine_names_s'] * 1e3:.2f} ms (one manifest), vllm names {med['vllm']['engine_names_s'] * 1e3:.2f} ms (two)\n"
        + "\n".join(loadavg) + "\n"
    )
    (out / "summary.txt").write_text(summary)
    print(summary, end="")


if __name__ == "__main__":
    main()
