#!/bin/bash
# 2026-12-05, the development VM (2 cores, shared with five other sessions; load average in the
# uptime files), Node 20, host backend, hot page cache, the example checkpoint
# (examples/tiny-llama, 10.0 MB): a daemon restart that adopts from the keeper (bench/restart.ts),
# each build through its own launcher (./weightd: dist/main.cjs with scripts/node-flags):
# before: main at 37f7919's ./weightd in /tmp/h33adopt-base (a detached worktree of main, its dist/
#         built by npm run build:ts, /work/main's node_modules and build/);
# after:  branch h33adopt's ./weightd (the rank adopts on the main thread, src/actors/adoptHere.ts).
# Eight pairs of one run each (--runs 1), before then after in each pair, so both builds see the
# same load of the machine within minutes; each run is a full start, a stop, and the restart timed.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-host-restart-adopt-here
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-/work/main/.venv/bin/python}
git log -1 --format='%H %s' > $out/commit.txt
git -C /tmp/h33adopt-base log -1 --format='%H %s' > $out/commit-before.txt
uptime > $out/uptime-before.txt
for pair in 1 2 3 4 5 6 7 8; do
  WEIGHTD_BIN=/tmp/h33adopt-base/weightd node dist/bench/restart.js --out $out/before-$pair --runs 1
  WEIGHTD_BIN=$PWD/weightd node dist/bench/restart.js --out $out/after-$pair --runs 1
done
uptime > $out/uptime-after.txt
