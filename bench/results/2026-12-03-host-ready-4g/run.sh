#!/bin/bash
# 2026-12-03 ~15:30 UTC, the development VM (2 cores), host backend, hot page cache, main at
# 3dd0af4's src (bench/ready.ts now stops its daemon when an attach fails): READY against `cp`
# into /dev/shm at 4.32 GB (bench/llamaCheckpoint.ts SMALL_LLAMA --gib 4, 408 tensors), tp=1 and
# tp=2, 3 runs, best of 3 each. A clean re-run of ../2026-12-03-host-columns-rerun's ready-4g,
# which ran beside a daemon left over by a failed run (../2026-12-03-host-columns/NOTE.txt).
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-03-host-ready-4g
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-$PWD/.venv/bin/python}
uptime > $out/uptime-before.txt
cat /var/tmp/host-4g/*.safetensors > /dev/null
node dist/bench/ready.js --model /var/tmp/host-4g --out $out/ready-4g --device host --runs 3 --tp 1,2 > $out/ready-4g.log 2>&1
uptime > $out/uptime-after.txt
