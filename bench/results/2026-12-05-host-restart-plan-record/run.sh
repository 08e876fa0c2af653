#!/bin/bash
# 2026-12-05, the development VM (2 cores, shared with other sessions; load average in the uptime
# files), Node 20, host backend, hot page cache: a daemon restart that adopts from the keeper
# (bench/restart.ts), each build through its own launcher (./weightd: dist/main.cjs):
# before: main at e5bc102's ./weightd in /tmp/hplanrec-base (a detached worktree of main, its dist/
#         built by npm run build:ts, /work/main's node_modules and build/);
# after:  branch hplanrec's ./weightd (the plan from the keeper's record; the chart code off the
#         start path).
# Two checkpoints: the example (examples/tiny-llama, 10.0 MB, 39 tensors) and a Llama-shaped one
# of 5,286 small tensors (48 MB, hidden 64, 586 layers; bench/llamaCheckpoint.ts, made once in
# /var/tmp/hplanrec-ck5k), where planning from the headers is most of a restart.
# Pairs of one run each (--runs 1), before then after in each pair, so both builds see the same
# load within seconds; each run is a full start, a stop, and the restart timed.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-host-restart-plan-record
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-/work/main/.venv/bin/python}
git log -1 --format='%H %s' > $out/commit.txt
git -C /tmp/hplanrec-base log -1 --format='%H %s' > $out/commit-before.txt
node -e "
const { writeLlamaCheckpoint } = await import('./dist/bench/llamaCheckpoint.js');
await writeLlamaCheckpoint('/var/tmp/hplanrec-ck5k', 0.045, { hidden: 64, intermediate: 128, heads: 4, kvHeads: 4, vocab: 256 });
" --input-type=module
uptime > $out/uptime-before.txt
for pair in 1 2 3 4 5 6 7 8; do
  WEIGHTD_BIN=/tmp/hplanrec-base/weightd node dist/bench/restart.js --out $out/example-before-$pair --runs 1
  WEIGHTD_BIN=$PWD/weightd node dist/bench/restart.js --out $out/example-after-$pair --runs 1
done
uptime > $out/uptime-middle.txt
for pair in 1 2 3 4 5 6; do
  WEIGHTD_BIN=/tmp/hplanrec-base/weightd node dist/bench/restart.js --model /var/tmp/hplanrec-ck5k --out $out/ck5k-before-$pair --runs 1
  WEIGHTD_BIN=$PWD/weightd node dist/bench/restart.js --model /var/tmp/hplanrec-ck5k --out $out/ck5k-after-$pair --runs 1
done
uptime > $out/uptime-after.txt
