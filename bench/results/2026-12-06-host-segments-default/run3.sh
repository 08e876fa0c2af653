#!/bin/bash
# As run2.sh, tp=1 only, started once the VM's 1-minute load average fell below GATE (other
# sessions' work swamped run1 and run2, load 7-18), or after WAIT seconds regardless; before each
# pair it waits again (at most 60 s) for the load to fall below GATE. Each step's load is in load.jsonl.
# Usage: run3.sh OUTDIR [PAIRS] [GATE] [WAIT]
set -e
out=$1
pairs=${2:-8}
gate=${3:-4}
wait_s=${4:-1200}
here=$(cd "$(dirname "$0")" && pwd)
after=/tmp/hhostseg/after
model=/tmp/hhostseg/model
mkdir -p "$out/ready"
load() { echo "{\"step\":\"$1\",\"at\":\"$(date -u +%FT%TZ)\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"; }
quiet() { local n=0; while awk -v g="$gate" '{ exit !($1 >= g) }' /proc/loadavg && [ $n -lt "$1" ]; do sleep 5; n=$((n + 5)); done; }
order() { if [ $(($1 % 2)) -eq 1 ]; then echo base after; else echo after base; fi; }
load gate-start
quiet "$wait_s"
cat $model/*.safetensors > /dev/null
load phase-start
for i in $(seq 1 "$pairs"); do
  quiet 60
  for v in $(order $i); do node "$here/fill-phase.mjs" /tmp/hhostseg/$v $model 1 0; done
done >> "$out/phase.jsonl"
load phase-end
cd $after
for i in $(seq 1 "$pairs"); do
  quiet 60
  cat $model/*.safetensors > /dev/null
  for v in $(order $i); do
    load "ready $v tp=1 $i"
    WEIGHTD_PYTHON=/work/main/.venv/bin/python WEIGHTD_BIN=/tmp/hhostseg/$v/weightd node dist/bench/ready.js --model $model --device host --tp 1 --runs 1 --out "$out/ready/$v-tp1-$i" > /dev/null
  done
done
load ready-end
