"""Summarizes run.sh's output folder: the allocate + fill pairs (phase.jsonl), then per pair the
daemons' READY (tp=1, tp=2), CPU at READY, each rank's allocate and fill from its log lines, and
the `cp` baseline of the same invocation; paired differences (after - base) and medians.
Usage: python3 summarize.py RUNDIR  (prints Markdown)"""
import json, re, statistics, sys
from pathlib import Path

run = Path(sys.argv[1])
med = lambda xs: round(statistics.median(xs)) if xs else None

print(f"## {run.name}\n")
phase = [json.loads(l) for l in open(run / "phase.jsonl")]
for tree in ("base", "after"):
    rows = [p for p in phase if p["tree"].endswith(tree)]
    print(f"- fill-phase {tree}: segments {rows[0]['segments']}, allocate + fill median {med([r['totalMs'] for r in rows])} ms (best {round(min(r['totalMs'] for r in rows))}), "
          f"allocate {med([r['allocateMs'] for r in rows])}, fill {med([r['fillMs'] for r in rows])}, CPU {med([r['cpuMs'] for r in rows])} ms, load {min(r['loadavg'][0] for r in rows)}-{max(r['loadavg'][0] for r in rows)}")
# Consecutive rows are a pair, in either order (run2.sh and run3.sh swap it every pair).
byPair = [sorted(phase[i:i + 2], key=lambda p: not p["tree"].endswith("base")) for i in range(0, len(phase) - 1, 2)]
diffs = [a["totalMs"] - b["totalMs"] for b, a in byPair]
print(f"- fill-phase paired (after - base): median {med(diffs)} ms, range {round(min(diffs))} to {round(max(diffs))}, {sum(d < 0 for d in diffs)} of {len(diffs)} faster\n")

def invocation(folder):
    rows = [json.loads(l) for l in open(folder / "raw.jsonl")]
    out = {"cp": next(r["baselineWallMs"] for r in rows if "baselineWallMs" in r)}
    for r in rows:
        if "tp" in r:
            out[r["tp"]] = {"ready": r["readyWallMs"], "cpu": r["cpuAtReadyMs"], "alloc": [], "fill": []}
    for l in open(folder / "daemon.jsonl"):
        j = json.loads(l)
        m = re.match(r"rank \d+ (allocated|loaded) .* in ([\d.]+) (ms|s)\b", j.get("msg", ""))
        if m and j.get("tp") in out:
            ms = float(m.group(2)) * (1000 if m.group(3) == "s" else 1)
            out[j["tp"]]["alloc" if m.group(1) == "allocated" else "fill"].append(ms)
        m = re.search(r"\((\d+) segments?\)", j.get("msg", ""))
        if m and j.get("tp") in out:
            out[j["tp"]]["segments"] = int(m.group(1))
    return out

# run.sh: <tree>-<i>/ holds tp=1 and tp=2; run2.sh: <tree>-tp<TP>-<i>/ holds one tp.
pairs = {1: [], 2: []}
for tp in (1, 2):
    i = 1
    while True:
        names = [f"{v}-tp{tp}-{i}" for v in ("base", "after")]
        if not (run / "ready" / names[0]).exists():
            names = [f"{v}-{i}" for v in ("base", "after")]
        if not all((run / "ready" / n / "raw.jsonl").exists() for n in names):
            break
        b, a = (invocation(run / "ready" / n) for n in names)
        pairs[tp].append(({"cp": b["cp"], **b[tp]}, {"cp": a["cp"], **a[tp]}))
        i += 1
print("| pair | tp | READY base | READY after | after - base | CPU base / after | allocate base / after (max rank) | fill base / after (max rank) | `cp` base / after invocation |")
print("|---|---|---|---|---|---|---|---|---|")
for tp in (1, 2):
    for n, (b, a) in enumerate(pairs[tp], 1):
        print(f"| {n} | {tp} | {round(b['ready'])} | {round(a['ready'])} | {round(a['ready'] - b['ready']):+d} | {b['cpu']} / {a['cpu']} | "
              f"{round(max(b['alloc']))} / {round(max(a['alloc']))} | {round(max(b['fill']))} / {round(max(a['fill']))} | {round(b['cp'])} / {round(a['cp'])} |")
print()
for tp in (1, 2):
    ps = pairs[tp]
    if not ps:
        continue
    d = [a["ready"] - b["ready"] for b, a in ps]
    print(f"- tp={tp}: segments base {ps[0][0].get('segments')} / after {ps[0][1].get('segments')} a rank; READY median base {med([b['ready'] for b, _ in ps])} (best {round(min(b['ready'] for b, _ in ps))}), "
          f"after {med([a['ready'] for _, a in ps])} (best {round(min(a['ready'] for _, a in ps))}); paired median {med(d)} ms ({round(min(d))} to {round(max(d))}, {sum(x < 0 for x in d)} of {len(d)} faster); "
          f"CPU median {med([b['cpu'] for b, _ in ps])} / {med([a['cpu'] for _, a in ps])} ms; allocate (max rank) median {med([max(b['alloc']) for b, _ in ps])} / {med([max(a['alloc']) for _, a in ps])}; "
          f"fill {med([max(b['fill']) for b, _ in ps])} / {med([max(a['fill']) for _, a in ps])}")
cps = [x["cp"] for tp in (1, 2) for p in pairs[tp] for x in p]
print(f"- `cp` to /dev/shm, every invocation: median {med(cps)} ms, best {round(min(cps))}")
print(f"- `cp` best over READY tp=1 best (issue 33's ratio, >= 1.0x is the target): base {min(cps) / min(b['ready'] for b, _ in pairs[1]):.2f}x, after {min(cps) / min(a['ready'] for _, a in pairs[1]):.2f}x")
