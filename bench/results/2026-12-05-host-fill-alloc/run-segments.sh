#!/bin/bash
# 2026-12-05, the same VM and checkpoint as run.sh. main 5cb8fc9 (BASE, /tmp/hfill-base) against
# this branch (AFTER: a rank's segments are reserved at once, one thread each, and the fill takes
# chunks from each segment in turn), alternating, each with one segment per rank (no plan file)
# and with the arena cut into 256 MiB segments (segments-256mib.json: 7 at tp=1, 4 per rank at tp=2).
#   1. fill-phase.mjs, one rank's allocate + fill, 6 runs each -> segments/phase.jsonl
#   2. bench/ready.ts (this branch's), tp=1 then tp=2 and one `cp` per invocation -> segments/ready/
# Usage: run-segments.sh OUTDIR [PAIRS]
set -e
out=$1
pairs=${2:-6}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
base=/tmp/hfill-base
model=/tmp/h2g/model
plan=$here/segments-256mib.json
mkdir -p "$out/ready"
cd "$root"
cat $model/*.safetensors > /dev/null
load() { echo "{\"step\":\"$1\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"; }
load phase-start
for i in $(seq 1 "$pairs"); do
  node "$here/fill-phase.mjs" $base $model 1 0
  node "$here/fill-phase.mjs" "$root" $model 1 0
  HFILL_PLAN_FILE=$plan node "$here/fill-phase.mjs" $base $model 1 0
  HFILL_PLAN_FILE=$plan node "$here/fill-phase.mjs" "$root" $model 1 0
done >> "$out/phase.jsonl"
load phase-end
for i in $(seq 1 "$pairs"); do
  for v in base after base-seg after-seg; do
    bin=$root/weightd; extra=()
    case $v in base|base-seg) bin=$base/weightd;; esac
    case $v in *-seg) extra=(--plan-file "$plan");; esac
    load "ready $v $i"
    WEIGHTD_PYTHON=/work/main/.venv/bin/python WEIGHTD_BIN=$bin node dist/bench/ready.js --model $model --device host --tp 1,2 --runs 1 "${extra[@]}" --out "$out/ready/$v-$i" > /dev/null
  done
done
load ready-end
