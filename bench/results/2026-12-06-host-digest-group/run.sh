#!/bin/bash
# BASE (main before the digest group) against AFTER (host ranks in a digest group), paired, the
# order swapped every pair, on the 1.8 GB Llama of $MODEL, hot page cache:
#   1. fill-ranks.mjs, tp 1 and 2, PAIRS pairs -> fill.jsonl
#   2. per pair, per tp: bench/ready.ts --tp TP --runs 1 (with its `cp`) for each tree -> ready/<tree>-tp<TP>-<i>/
# Usage: [BASE=DIR] [AFTER=DIR] run.sh OUTDIR [PAIRS]   (the trees, built: default /tmp/hb/base and /tmp/hb/after)
set -e
out=$1
pairs=${2:-6}
here=$(cd "$(dirname "$0")" && pwd)
model=${MODEL:-/tmp/hb/model}
mkdir -p "$out/ready"
cat $model/*.safetensors > /dev/null
load() { echo "{\"step\":\"$1\",\"at\":\"$(date -u +%FT%TZ)\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"; }
order() { if [ $(($1 % 2)) -eq 1 ]; then echo base after; else echo after base; fi; }
tree() { if [ $1 = base ]; then echo ${BASE:-/tmp/hb/base}; else echo ${AFTER:-/tmp/hb/after}; fi; }
load fill-start
for i in $(seq 1 "$pairs"); do
  for tp in 1 2; do
    for v in $(order $i); do node "$here/fill-ranks.mjs" $(tree $v) $model $tp; done
  done
done >> "$out/fill.jsonl"
load fill-end
cd $(tree after)
for i in $(seq 1 "$pairs"); do
  for tp in 1 2; do
    for v in $(order $i); do
      load "ready $v tp=$tp $i"
      cat $model/*.safetensors > /dev/null
      WEIGHTD_PYTHON=/work/main/.venv/bin/python WEIGHTD_BIN=$(tree $v)/weightd node dist/bench/ready.js --model $model --device host --tp $tp --runs 1 --out "$out/ready/$v-tp$tp-$i" > /dev/null
    done
  done
done
load ready-end
