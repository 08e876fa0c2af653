#!/usr/bin/env python3
"""Several engines' first attach at once against one engine's alone, for two builds of the Python
client, in one run.

  python3 bench/attach-concurrent.py --socket-dir DIR --before OLD/clients/python [--after clients/python]
                                     [--device cuda|host] [--engines 8] [--runs 3] --out FILE

Per run and build (alternating which build goes first): one fresh process attaches alone, then
--engines fresh processes, each with torch imported (and on cuda its context made), attach at
the same moment (bench/attach-once.py --wait: all say ready, then all are told to go). Each
reports firstUsableMs (every view touched). Writes one JSON line per process to --out (which must
not exist) and prints, per build, the median solo time, the median and slowest concurrent time
and the slowest's ratio to solo (issue 33's target: at most 2).
"""
import json
import statistics
import subprocess
import sys

from attach_builds import ATTACH_ONCE, client_env, parse_args


def attach_together(client_path, socket_dir, device, n):
    procs = [subprocess.Popen([sys.executable, ATTACH_ONCE, socket_dir, device, "--wait"], env=client_env(client_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        line = p.stdout.readline().strip()
        if line != "ready":
            p.kill()
            raise RuntimeError(f"attach-once with the client in {client_path} did not get ready: {line!r} {p.stderr.read()[-2000:]}")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    rows = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"attach with the client in {client_path} exited {p.returncode}: {err[-2000:]}")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def main():
    a, builds = parse_args(__doc__, runs=3, more=lambda ap: ap.add_argument("--engines", type=int, default=8))
    for build in builds:  # untimed: the daemon's first request for each manifest form
        attach_together(builds[build], a.socket_dir, a.device, 1)
    rows = []
    with open(a.out, "w") as f:
        for run in range(a.runs):
            for build in (["before", "after"] if run % 2 == 0 else ["after", "before"]):
                for mode, n in (("solo", 1), ("together", a.engines)):
                    for row in attach_together(builds[build], a.socket_dir, a.device, n):
                        row = {"run": run, "build": build, "mode": mode, "engines": n, **row}
                        rows.append(row)
                        f.write(json.dumps(row) + "\n")
    summary = {"device": a.device, "engines": a.engines, "runs": a.runs, "tensors": rows[0]["tensors"]}
    for build in builds:
        solo = [r["firstUsableMs"] for r in rows if r["build"] == build and r["mode"] == "solo"]
        together = [r["firstUsableMs"] for r in rows if r["build"] == build and r["mode"] == "together"]
        summary[build] = {
            "soloMedianMs": round(statistics.median(solo), 2),
            "togetherMedianMs": round(statistics.median(together), 2),
            "togetherSlowestMs": round(max(together), 2),
            "slowestOverSolo": round(max(together) / statistics.median(solo), 2),
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
