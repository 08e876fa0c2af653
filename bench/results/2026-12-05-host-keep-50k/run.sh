#!/bin/bash
# 2026-12-05, the development VM (2 cores, shared with five other sessions; load average in the
# uptime files), Node 20, host backend, hot page cache, 50,438 tensors in 1.29 GB
# (bench/gpu/make-checkpoint.py, make-checkpoint.txt): a daemon restart with --keeper spawn
# (bench/restart.ts), each build through its own launcher (./weightd):
# before: main's ./weightd in /tmp/hkeepbig-base (a detached worktree of main, commit-before.txt,
#         its dist/ built by npm run build:ts, /work/main's node_modules and build/): its keeper
#         refuses the 2.7 MB record (a KEEP held 1 MiB), so its restart loads from the checkpoint;
# after:  branch hkeepbig's ./weightd: the record is kept, the restart adopts and plans from it.
# Pairs of one run each (--runs 1), before then after in each pair, so both builds see the same
# load of the machine within minutes; each run is a full start, a stop, and the restart timed.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-host-keep-50k
ck=/var/tmp/hkeepbig-ck50k
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-/work/main/.venv/bin/python}
[ -f $ck/model.safetensors.index.json ] || $WEIGHTD_PYTHON bench/gpu/make-checkpoint.py --out $ck --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 > $out/make-checkpoint.txt
git log -1 --format='%H %s' > $out/commit.txt
git -C /tmp/hkeepbig-base log -1 --format='%H %s' > $out/commit-before.txt
uptime > $out/uptime-before.txt
for pair in 1 2 3 4 5 6; do
  WEIGHTD_BIN=/tmp/hkeepbig-base/weightd node dist/bench/restart.js --model $ck --out $out/before-$pair --runs 1 --restart-may-load
  WEIGHTD_BIN=$PWD/weightd node dist/bench/restart.js --model $ck --out $out/after-$pair --runs 1
done
uptime > $out/uptime-after.txt
