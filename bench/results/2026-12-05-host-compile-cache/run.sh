#!/usr/bin/env bash
# Issue 33, the code cache: paired runs of the bundle without (before) and with (after) the launcher
# and its build-time cache, on the example, host backend. Run from the checkout's root after npm run build.
set -euo pipefail
R=bench/results/2026-12-05-host-compile-cache
git rev-parse HEAD > $R/commit.txt
uptime > $R/uptime-before.txt
node dist/bench/startup.js --before dist/main.cjs --after dist/launch.cjs --runs 16 --out $R/startup
uptime > $R/uptime-after-startup.txt
for pair in $(seq 1 8); do
  order="before after"; [ $((pair % 2)) = 0 ] && order="after before"
  for b in $order; do
    bin=$R/before-launcher.sh; [ $b = after ] && bin=./weightd
    WEIGHTD_BIN=$bin node dist/bench/restart.js --out $R/restart/$b-$pair --runs 1 --device host
  done
done
uptime > $R/uptime-after.txt
