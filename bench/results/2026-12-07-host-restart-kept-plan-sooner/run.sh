#!/bin/bash
# 2026-12-07, the development VM (2 cores). A start that loads, with --keeper spawn, then a
# restart that adopts (bench/restart.ts, host backend, example checkpoint, 3 runs each), through
# each checkout's ./weightd: BASE main 92fc6ac (/tmp/ref) against AFTER this checkout (7c72c25:
# the record parsed without zod's compiled fast path, the planner digest from the bundle, the
# keeper's LIST while the devices are probed), alternating, PAIRS pairs.
# Usage: run.sh OUTDIR [PAIRS] [MODEL]
set -e
out=$1; pairs=${2:-8}; model=${3:-/work/main/examples/tiny-llama}
cd /work/main
for i in $(seq 1 "$pairs"); do
  order="base after"; [ $((i % 2)) = 0 ] && order="after base"
  for v in $order; do
    bin=/work/main/weightd; [ $v = base ] && bin=/tmp/ref/weightd
    echo "{\"run\":\"$v-$i\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"
    PATH=/work/main/.venv/bin:$PATH WEIGHTD_BIN=$bin node dist/bench/restart.js --model $model --out "$out/$v-$i" --runs 3 --device host > /dev/null
  done
done
