#!/bin/bash
# 2026-12-05, the development VM (2 cores, shared with five other sessions; load average in the
# uptime files), Node 20.20.2, host backend, hot page cache, the example checkpoint
# (examples/tiny-llama, 10.0 MB): a daemon restart that adopts from the keeper (bench/restart.ts),
# through each build's launcher, so with scripts/node-flags:
# before: main at d86c487's ./weightd (dist/main.js) in /tmp/h33-base (its dist/ built by tsc,
#         this checkout's node_modules and build/);
# after:  branch h33start's ./weightd (dist/main.cjs, the bundle).
# Three rounds of 3 runs each, the builds alternating round by round (before, after, before, ...):
# not paired within a run (restart.js takes one daemon command), but interleaved in time.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-host-restart-bundle
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-/work/main/.venv/bin/python}
git log -1 --format='%H %s' > $out/commit.txt
uptime > $out/uptime-before.txt
for round in 1 2 3; do
  WEIGHTD_BIN=/tmp/h33-base/weightd node dist/bench/restart.js --out $out/before-$round --runs 3
  WEIGHTD_BIN=$PWD/weightd node dist/bench/restart.js --out $out/after-$round --runs 3
done
uptime > $out/uptime-after.txt
