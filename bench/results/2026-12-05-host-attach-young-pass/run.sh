#!/bin/bash
# 2026-12-05, the development VM (2 cores, shared: load in uptime-*.txt). What the attach's young
# pass (client._collector_paused: gc.collect(1) before the collector pause) costs where a first
# attach runs: a fresh process that imported torch, numpy and the client. 10 processes.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-host-attach-young-pass
PY=${WEIGHTD_PYTHON:-.venv/bin/python}
git rev-parse HEAD > $out/commit.txt; uptime > $out/uptime-before.txt
: > $out/young-pass.jsonl
for i in $(seq 10); do
  PYTHONPATH=clients/python $PY -c '
import gc, json, time
import torch, numpy, weightd_client
young = gc.get_count()
cpu, wall = time.process_time_ns(), time.perf_counter_ns()
gc.collect(1)
print(json.dumps({"count": young, "cpuUs": (time.process_time_ns() - cpu) // 1000, "wallUs": (time.perf_counter_ns() - wall) // 1000}))
' >> $out/young-pass.jsonl
done
uptime > $out/uptime-after.txt
