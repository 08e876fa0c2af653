#!/bin/bash
# 2026-12-06, the development VM (2 cores, shared with other sessions). BASE: main 71a33c4
# (/tmp/hhostseg/base, built from `git archive`); AFTER: this branch (/tmp/hhostseg/after), whose
# daemon cuts a host arena into segments by default (1.9 GB at tp=1: 16 of ~119 MB). The 1.9 GB
# Llama of /tmp/h2g/model copied to /tmp/hhostseg/model (147 tensors, 4 shards), hot page cache.
#   1. fill-phase.mjs: one rank's allocate + fill, PAIRS pairs, alternating -> phase.jsonl
#   2. bench/ready.ts (AFTER's copy), tp=1 and tp=2 and one `cp` to /dev/shm per invocation,
#      alternating base / after -> ready/<tree>-<i>/
# The load average before each step -> load.jsonl.
# Usage: run.sh OUTDIR [PAIRS]
set -e
out=$1
pairs=${2:-6}
here=$(cd "$(dirname "$0")" && pwd)
base=/tmp/hhostseg/base
after=/tmp/hhostseg/after
model=/tmp/hhostseg/model
mkdir -p "$out/ready"
cat $model/*.safetensors > /dev/null
load() { echo "{\"step\":\"$1\",\"at\":\"$(date -u +%FT%TZ)\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"; }
load phase-start
for i in $(seq 1 "$pairs"); do
  node "$here/fill-phase.mjs" $base $model 1 0
  node "$here/fill-phase.mjs" $after $model 1 0
done >> "$out/phase.jsonl"
load phase-end
cd $after
for i in $(seq 1 "$pairs"); do
  for v in base after; do
    bin=$after/weightd
    [ $v = base ] && bin=$base/weightd
    load "ready $v $i"
    WEIGHTD_PYTHON=/work/main/.venv/bin/python WEIGHTD_BIN=$bin node dist/bench/ready.js --model $model --device host --tp 1,2 --runs 1 --out "$out/ready/$v-$i" > /dev/null
  done
done
load ready-end
