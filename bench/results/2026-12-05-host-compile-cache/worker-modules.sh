#!/usr/bin/env bash
# CPU of loading what the rank's worker thread loads (startup/modules-after-daemon.txt: dist/src's
# ES modules but rankWorker.js itself, which would run; xstate and the addon come with them), in a
# fresh process, 20 processes each, against Node alone; and xstate and the addon alone.
set -euo pipefail
R=bench/results/2026-12-05-host-compile-cache
F=$(sed '/^#/d' scripts/node-flags)
imports=$(grep '^esm file://.*/dist/src' $R/startup/modules-after-daemon.txt | grep -v rankWorker.js | sed "s|^esm file://.*/dist/src/|./dist/src/|" | while read -r u; do printf "await import('%s');" "$(pwd)/${u#./}"; done)
loop() { for _ in $(seq 1 20); do "$@" >/dev/null; done; }
for round in 1 2 3; do
  for what in node worker-modules xstate addon; do
    case $what in
      node) code=0 ;; worker-modules) code=$imports ;; xstate) code="await import('xstate')" ;; addon) code="await import('$(pwd)/dist/src/native/addon.js')" ;;
    esac
    echo "round $round $what (20 processes): $( { time loop node $F --input-type=module -e "$code"; } 2>&1 | grep -E 'user|sys' | tr '\n\t' '  ')"
  done
done
