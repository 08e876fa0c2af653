#!/bin/bash
# As run.sh, paired more tightly (run1's invocations timed tp=1, tp=2 and `cp` in one, ~20 s apart,
# and the load swung by seconds between them): one tp per bench/ready.ts invocation, base and
# after back to back, their order swapped every pair, each invocation with its own `cp`.
#   1. fill-phase.mjs, PAIRS pairs, order swapped every pair -> phase.jsonl
#   2. per pair, per tp (1, 2): bench/ready.ts --tp TP --runs 1 for base and after -> ready/<tree>-tp<TP>-<i>/
# Usage: run2.sh OUTDIR [PAIRS]
set -e
out=$1
pairs=${2:-8}
here=$(cd "$(dirname "$0")" && pwd)
base=/tmp/hhostseg/base
after=/tmp/hhostseg/after
model=/tmp/hhostseg/model
mkdir -p "$out/ready"
cat $model/*.safetensors > /dev/null
load() { echo "{\"step\":\"$1\",\"at\":\"$(date -u +%FT%TZ)\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"; }
order() { if [ $(($1 % 2)) -eq 1 ]; then echo base after; else echo after base; fi; }
load phase-start
for i in $(seq 1 "$pairs"); do
  for v in $(order $i); do node "$here/fill-phase.mjs" /tmp/hhostseg/$v $model 1 0; done
done >> "$out/phase.jsonl"
load phase-end
cd $after
for i in $(seq 1 "$pairs"); do
  for tp in 1 2; do
    for v in $(order $i); do
      load "ready $v tp=$tp $i"
      cat $model/*.safetensors > /dev/null
      WEIGHTD_PYTHON=/work/main/.venv/bin/python WEIGHTD_BIN=/tmp/hhostseg/$v/weightd node dist/bench/ready.js --model $model --device host --tp $tp --runs 1 --out "$out/ready/$v-tp$tp-$i" > /dev/null
    done
  done
done
load ready-end
