#!/bin/bash
# 2026-12-05, the development VM (2 cores, shared with five other sessions; load average in the
# uptime files), Node 20.20.2, host backend, hot page cache, a 2.2 GB Llama-shaped checkpoint
# (16 layers, hidden 2048, intermediate 8192, vocab 32000, 4 shards; as bench/verify-2gb.sh makes
# it) in /tmp/h33-2g/model.
# 1. startup.js, paired: before (main at d86c487, dist/main.js) against bundle (branch h33start,
#    dist/main.cjs, what ./weightd runs), tp=1, 4 repetitions; every process with scripts/node-flags.
# 2. ready.js with WEIGHTD_BIN=./weightd (the launcher: the bundle and the flags), tp=1 and tp=2
#    against `cp` into /dev/shm in the same run, 3 runs. Needs WEIGHTD_PYTHON (the first attempt,
#    ready/, stopped at its first attach without it; ready-2/ is the re-run: bash run.sh ready-only).
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-host-startup-bundle-2g
model=/tmp/h33-2g/model
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-/work/main/.venv/bin/python}
if [ "${1:-}" != ready-only ]; then
  git log -1 --format='%H %s' > $out/commit.txt
  uptime > $out/uptime-before.txt
  node dist/bench/startup.js --before /tmp/h33-base/dist/main.js --after dist/main.cjs --model $model --out $out/startup --runs 4
fi
uptime > $out/uptime-before-ready-2.txt
WEIGHTD_BIN=$PWD/weightd node dist/bench/ready.js --model $model --device host --tp 1,2 --runs 3 --out $out/ready-2
uptime > $out/uptime-after.txt
