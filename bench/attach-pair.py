#!/usr/bin/env python3
"""The first attach of a fresh process with two builds of the Python client, paired in one run.

  python3 bench/attach-pair.py --socket-dir DIR --before OLD/clients/python [--after clients/python]
                               [--device cuda|host] [--runs 5] --out FILE

Each run starts one fresh process per build (bench/attach-once.py, with that build's client on
PYTHONPATH), back to back in alternating order (the machine's load drifts over both alike), after
one untimed attach per build. Writes one JSON line per process to --out (which must not exist),
with the load average (1, 5, 15 min) as it started, and prints the medians and the median of the
paired differences (after - before).
"""
import json
import statistics
import subprocess
import sys

from attach_builds import ATTACH_ONCE, client_env, parse_args


def attach_once(client_path, socket_dir, device):
    r = subprocess.run([sys.executable, ATTACH_ONCE, socket_dir, device], env=client_env(client_path), capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"attach with the client in {client_path} exited {r.returncode}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    a, builds = parse_args(__doc__, runs=5)
    rows = []
    # One untimed attach per build first: the daemon encodes a manifest form on its first request
    # for it (the objects an older client asks for), which no later attach pays.
    for build in builds:
        attach_once(builds[build], a.socket_dir, a.device)
    with open(a.out, "w") as f:
        for run in range(a.runs):
            order = ["before", "after"] if run % 2 == 0 else ["after", "before"]
            for build in order:
                with open("/proc/loadavg") as load:
                    loadavg = [float(x) for x in load.read().split()[:3]]
                row = {"run": run, "build": build, "loadavg": loadavg, **attach_once(builds[build], a.socket_dir, a.device)}
                rows.append(row)
                f.write(json.dumps(row) + "\n")
    summary = {"device": a.device, "runs": a.runs, "tensors": rows[0]["tensors"]}
    for key in ("firstMs", "firstUsableMs", "firstCpuMs", "secondMs"):
        by = {b: [r[key] for r in rows if r["build"] == b] for b in builds}
        summary[key] = {b: round(statistics.median(v), 2) for b, v in by.items()}
        summary[key]["pairedDiffMedian"] = round(statistics.median(x - y for x, y in zip(by["after"], by["before"])), 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
