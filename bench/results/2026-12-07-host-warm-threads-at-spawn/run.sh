#!/bin/bash
# 2026-12-07, the development VM (2 cores). A start that loads, with --keeper spawn, then a
# restart that adopts (bench/restart.ts, host backend), through each checkout's ./weightd:
# BASE main e36603e (/tmp/ref) against AFTER this checkout (warm threads started when the keeper
# PING fails), alternating, PAIRS pairs. MODEL: the 1.9 GB Llama at /tmp/h2g/model.
# Usage: run.sh OUTDIR [PAIRS] [MODEL]
set -e
out=$1; pairs=${2:-8}; model=${3:-/tmp/h2g/model}
cd /work/main
for i in $(seq 1 "$pairs"); do
  order="base after"; [ $((i % 2)) = 0 ] && order="after base"
  for v in $order; do
    bin=/work/main/weightd; [ $v = base ] && bin=/tmp/ref/weightd
    echo "{\"run\":\"$v-$i\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"
    PATH=/work/main/.venv/bin:$PATH WEIGHTD_BIN=$bin node dist/bench/restart.js --model $model --out "$out/$v-$i" --runs 1 --device host > /dev/null
  done
done
