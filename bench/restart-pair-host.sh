#!/bin/bash
# Two builds paired on this machine, host backend: a start that loads with --keeper spawn, then a
# restart that adopts (bench/restart.ts, RUNS of each a process), through each checkout's
# ./weightd: BASE (another checkout's root, built) against this checkout ("after"), the order
# alternating, PAIRS pairs. Writes OUT/<base|after>-<pair>/ (restart.ts's files) and
# OUT/load.jsonl (the load average before each). Run from this checkout's root, built.
# Usage: bash bench/restart-pair-host.sh OUT BASE [PAIRS] [MODEL] [RUNS]
set -e
out=$1; base=$2; pairs=${3:-8}; model=${4:-examples/tiny-llama}; runs=${5:-1}
root=$(pwd)
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  order="base after"; [ $((i % 2)) = 0 ] && order="after base"
  for v in $order; do
    bin=$root/weightd; [ $v = base ] && bin=$base/weightd
    echo "{\"run\":\"$v-$i\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"
    PATH=$root/.venv/bin:$PATH WEIGHTD_BIN=$bin node dist/bench/restart.js --model "$model" --out "$out/$v-$i" --runs "$runs" --device host > /dev/null
  done
done
