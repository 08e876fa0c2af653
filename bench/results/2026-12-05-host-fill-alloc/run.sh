#!/bin/bash
# 2026-12-05, the development VM (2 cores, 24 GiB, kernel 6.18, shmem_enabled=never), shared with
# other sessions' work (the load average is recorded around every invocation).
# The host backend's allocation (issue 33): main 5cb8fc9 (BASE, a copy built in /tmp/hfill-base)
# against main plus variants.patch (EXP, built in /tmp/hfill-exp-tree), whose variant is chosen
# by environment: fallocate up front as main (HFILL_FALLOC=1) or pages made by the fill's pwrite
# (unset); the fill's writers queued on a user-space mutex per segment (default) or on the
# kernel's inode lock as main (HFILL_NOMUTEX=1).
#   1. fill-phase.mjs: one rank's allocate + fill in a fresh process, alternating, with one
#      segment and with the arena cut into 7 memfds (segments-256mib.json) -> phase.jsonl
#   2. READY with bench/ready.js (this branch's: it records the daemon's CPU at READY), tp=1 then
#      tp=2 and one `cp` to /dev/shm per invocation, alternating -> ready/<variant>-<pair>/
# Usage: run.sh OUTDIR [PAIRS]
set -e
out=$1
pairs=${2:-6}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
base=/tmp/hfill-base
exp=/tmp/hfill-exp-tree
model=/tmp/h2g/model
mkdir -p "$out/ready"
cd "$root"
cat $model/*.safetensors > /dev/null
load() { echo "{\"step\":\"$1\",\"uptime\":\"$(uptime)\"}" >> "$out/load.jsonl"; }
load phase-start
for i in $(seq 1 "$pairs"); do
  node "$here/fill-phase.mjs" $base $model 1 0
  HFILL_FALLOC=1 node "$here/fill-phase.mjs" $exp $model 1 0
  node "$here/fill-phase.mjs" $exp $model 1 0
  HFILL_NOMUTEX=1 node "$here/fill-phase.mjs" $exp $model 1 0
  HFILL_PLAN_FILE=$here/segments-256mib.json node "$here/fill-phase.mjs" $base $model 1 0
  HFILL_PLAN_FILE=$here/segments-256mib.json node "$here/fill-phase.mjs" $exp $model 1 0
done >> "$out/phase.jsonl"
load phase-end
for i in $(seq 1 "$pairs"); do
  for v in base exp-falloc-mutex exp-lazy-mutex; do
    bin=$exp/weightd; envs=""
    case $v in base) bin=$base/weightd;; exp-falloc-mutex) envs="HFILL_FALLOC=1";; esac
    load "ready $v $i"
    env $envs WEIGHTD_PYTHON=/work/main/.venv/bin/python WEIGHTD_BIN=$bin node dist/bench/ready.js --model $model --device host --tp 1,2 --runs 1 --out "$out/ready/$v-$i" > /dev/null
  done
done
load ready-end
