#!/bin/bash
# 2026-12-06, the development VM (2 cores, shared with six other sessions; load average in the
# uptime files), Node 20, host backend, hot page cache, the example checkpoint: a daemon restart
# that adopts from the keeper (bench/restart.ts), each build through its own launcher (./weightd):
# before: e607644 (branch h33cuda's parent on main) in /tmp/h33cuda-base (a detached worktree,
#         dist/ built by npm run build:ts, /work/main's node_modules and build/);
# after:  branch h33cuda's ./weightd (a cuda-fd rank adopts on the main thread too; the host path
#         gains a resolved promise per rank service and an await per get_segment_fds).
# Six pairs of one run each, before then after in each pair. The question is only whether the
# host path got slower: this branch changes nothing it runs but those two.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-06-host-restart-cuda-here
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-/work/main/.venv/bin/python}
git log -1 --format='%H %s' > $out/commit.txt
git -C /tmp/h33cuda-base log -1 --format='%H %s' > $out/commit-before.txt
uptime >> $out/uptime-before.txt
for pair in ${PAIRS:-1 2 3 4 5 6}; do
  WEIGHTD_BIN=/tmp/h33cuda-base/weightd node dist/bench/restart.js --out $out/before-$pair --runs 1
  WEIGHTD_BIN=$PWD/weightd node dist/bench/restart.js --out $out/after-$pair --runs 1
done
uptime >> $out/uptime-after.txt
