#!/bin/bash
# 2026-12-06 night, the development VM (2 cores). BASE: main 943a50e (this session's start, a
# worktree at /tmp/ref); AFTER: this checkout (pino bundled, launchers without
# NODE_EXTRA_CA_CERTS, which this VM's environment sets). The 1.9 GB Llama of
# bench/llamaCheckpoint.ts (1.8 GiB asked) at /tmp/h2g/model, hot. bench/ready.ts, tp=1 and tp=2
# and one `cp` to /dev/shm per invocation, base and after alternating, PAIRS pairs.
# Usage: run.sh OUTDIR [PAIRS]
set -e
out=$1; pairs=${2:-6}
base=/tmp/ref; after=/work/main; model=/tmp/h2g/model
cat $model/*.safetensors > /dev/null
load() { echo "{\"step\":\"$1\",\"at\":\"$(date -u +%FT%TZ)\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"; }
cd $after
for i in $(seq 1 "$pairs"); do
  order="base after"; [ $((i % 2)) = 0 ] && order="after base"
  for v in $order; do
    bin=$after/weightd; [ $v = base ] && bin=$base/weightd
    load "ready $v $i"
    WEIGHTD_PYTHON=/work/main/.venv/bin/python WEIGHTD_BIN=$bin node dist/bench/ready.js --model $model --device host --tp 1,2 --runs 1 --out "$out/ready/$v-$i" > /dev/null
  done
done
load ready-end
