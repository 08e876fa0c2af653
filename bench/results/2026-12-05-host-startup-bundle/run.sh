#!/bin/bash
# 2026-12-05, the development VM (2 cores, shared with five other sessions' builds and tests),
# Node 20.20.2, host backend, hot page cache, the bundled example checkpoint (examples/tiny-llama,
# 10.0 MB, 39 tensors), so that start-up overhead and not the fill is what is timed. Every process
# gets scripts/node-flags (--max-semi-space-size=1), as the launchers give it.
# before:           main at d86c487, dist/main.js (its dist/ built by tsc in a copy, with this
#                   checkout's node_modules and build/, which the branch does not change);
# after:            branch h33start, dist/main.js: the lazy imports (--version, --help and ctl load
#                   neither zod, xstate nor pino), unbundled;
# bundle:           the same branch, dist/main.cjs: the main thread bundled by esbuild, what the
#                   launchers now run;
# bundle-codecache: dist/main.cjs through codecache-loader.cjs (an experiment, not shipped): a V8
#                   code cache per command, written by the first, unrecorded run.
# Each repetition runs the four builds back to back, the order reversed every other one.
# run/ (00:56-00:58 UTC, 12 repetitions) was timed by wall clock only; run-2/ (20 repetitions)
# adds each process's CPU time: bash run.sh run-2 20.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-host-startup-bundle
run=${1:-run}
runs=${2:-12}
uptime > $out/uptime-before-$run.txt
git log -1 --format='%H %s' > $out/commit-$run.txt
export WEIGHTD_CODE_CACHE=$(mktemp -d)/code-cache
node dist/bench/startup.js --before /tmp/h33-base/dist/main.js --after dist/main.js \
  --build bundle=dist/main.cjs --build bundle-codecache=$out/codecache-loader.cjs --out $out/$run --runs $runs
uptime > $out/uptime-after-$run.txt
