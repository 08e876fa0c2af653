#!/bin/bash
# 2026-12-06 night, the development VM (2 cores; its environment sets NODE_EXTRA_CA_CERTS, as the
# GPU machines' does). A start that loads and a restart that adopts (bench/restart.ts, --keeper
# spawn, host backend, examples/tiny-llama), each through its checkout's ./weightd, as a user
# starts it: BASE main 943a50e (/tmp/ref) against AFTER this checkout, alternating, PAIRS pairs.
# Usage: run.sh OUTDIR [PAIRS]
set -e
out=$1; pairs=${2:-8}
cd /work/main
for i in $(seq 1 "$pairs"); do
  order="base after"; [ $((i % 2)) = 0 ] && order="after base"
  for v in $order; do
    bin=/work/main/weightd; [ $v = base ] && bin=/tmp/ref/weightd
    echo "{\"run\":\"$v-$i\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"
    PATH=/work/main/.venv/bin:$PATH WEIGHTD_BIN=$bin node dist/bench/restart.js --model examples/tiny-llama --out "$out/$v-$i" --runs 1 --device host > /dev/null
  done
done
