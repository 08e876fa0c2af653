#!/bin/bash
# 2026-12-03, the development VM (2 cores, shared with other work), Node 20.20.2, host backend,
# hot page cache, the bundled example checkpoint (examples/tiny-llama, 10.0 MB, 39 tensors).
# before: main at 918be10 (git worktree add --detach /tmp/h15-before 918be10; tsc, link-main, and
#         this checkout's node_modules and build/Release, which that commit does not change);
# after:  branch h15lazy at ded1eac (on-demand prom-client, pino-pretty, inspect server, per-command
#         imports in main, the rank worker's keeper side).
# 15 repetitions, each running both builds back to back in alternating order.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-03-host-startup-lazy
uptime > $out/uptime-before.txt
node dist/bench/startup.js --before /tmp/h15-before/dist/main.js --out $out/run --runs 15
uptime > $out/uptime-after.txt
