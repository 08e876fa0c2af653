"""Where a pull update's time goes on the fake libcuda (logic and the daemon's own CPU costs only:
the fake's copies and digests are memcpy and CPU hashing, no GPU figure). Runs a daemon serving
examples/tiny-llama (or --model DIR, cut into --segment-bytes segments) on fake GPU 0
(--cuda-handles fd), pulls REPS full updates from a trainer allocation of this process, and prints
the medians of the client's begin/pull/commit and of the daemon's split ("update sealed" timings,
pullTimings, "update committed" publishMs/commitMs). The fake makes at most 1024 VMM allocations
in a process: REPS times the segments must stay under that (8 reps of 60 segments do).

  LD_LIBRARY_PATH=<dir of the fake libcuda.so.1> FAKE_CUDA_DEVICES=2 \\
  PYTHONPATH=clients/python:clients/python/tests .venv/bin/python bench/pull-split-fake.py [REPS] [LOG]
      [--model DIR] [--segment-bytes N]
(build the fake as clients/python/tests/test_cuda_context.py's fake_env does.)"""
import argparse
import json
import os
import statistics
import tempfile
import time

from cuda_scenarios import TrainerMemory, served_fingerprint
from daemon_fixture import Daemon
from test_host_fds import MODEL, checkpoint_tensors

args = argparse.ArgumentParser()
args.add_argument("reps", type=int, nargs="?", default=20)
args.add_argument("log", nargs="?")
args.add_argument("--model", default=MODEL)
args.add_argument("--segment-bytes", type=int, default=1 << 20)
a = args.parse_args()
reps = a.reps
want = checkpoint_tensors(a.model)
plan = os.path.join(tempfile.mkdtemp(prefix="weightd-pull-split-"), "plan.json")
with open(plan, "w") as f:
    json.dump({"rules": [], "segmentBytes": a.segment_bytes}, f)
rows = []
with Daemon(a.model, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan, "--keep-versions", "2"]) as daemon:
    with daemon.client() as client:
        name = client.ping()["name"]
        base = served_fingerprint(client, name, 0)
        for rep in range(reps):
            trainer = TrainerMemory({n: bytes((b + rep + 1) % 256 for b in v) for n, v in want.items()})
            t0 = time.perf_counter()
            with client.begin_update(name, base, device=0, source="pull") as upd:
                t1 = time.perf_counter()
                upd.pull_from(trainer.tensors)
                t2 = time.perf_counter()
                done = upd.commit()
                t3 = time.perf_counter()
            trainer.free()
            base = done["fingerprint"]
            rows.append({"beginMs": (t1 - t0) * 1e3, "pullMs": (t2 - t1) * 1e3, "commitMs": (t3 - t2) * 1e3})
    daemon.stop()
    lines = daemon.stderr_lines
if a.log:
    with open(a.log, "w") as f:
        f.write("\n".join(lines))
sealed = [json.loads(l)["timings"] for l in lines if '"update sealed' in l]
committed = [json.loads(l) for l in lines if '"update committed' in l]
med = lambda xs: round(statistics.median(xs), 3)  # noqa: E731
print(json.dumps({
    "tensors": len(want),
    "reps": len(rows),
    "loadavg": os.getloadavg(),
    "client": {k: med([r[k] for r in rows]) for k in rows[0]},
    "sealed": {k: med([s[k] for s in sealed]) for k in sealed[0] if k != "pullTimings"},
    "pullTimings": {k: med([s["pullTimings"][k] for s in sealed]) for k in sealed[0]["pullTimings"]},
    "committed": {k: med([c[k] for c in committed]) for k in ("publishMs", "commitMs")},
}))
