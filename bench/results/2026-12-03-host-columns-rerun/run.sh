#!/bin/bash
# Re-run of ../2026-12-03-host-columns/ (see its NOTE.txt), 12 attach pairs per checkpoint.
# 2026-12-03, the development VM (2 cores, shared), host backend, hot page cache, main at 3dd0af4.
# 1. The first attach of a fresh process (torch imported first), client of main at 8526fb1
#    (before: objects manifest) against this commit's (after: columns), paired, alternating,
#    after one untimed attach each, against one daemon of this commit, at 128, 533 and 50,438 tensors.
#    before: git worktree add --detach /tmp/h15b-before 8526fb1 (its clients/python)
# 2. READY against `cp` into /dev/shm at 4.32 GB (bench/llamaCheckpoint.ts SMALL_LLAMA --gib 4,
#    408 tensors), tp=1 and tp=2, 3 runs, best of 3 each (ready.js).
# Checkpoints: as in ../2026-12-03-host-attach-50k/run.sh (ck130, ck500, ck50k), and
#   node -e "writeLlamaCheckpoint('/var/tmp/host-4g', 4)" (dist/bench/llamaCheckpoint.js).
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-03-host-columns-rerun
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-$PWD/.venv/bin/python}; PY=$WEIGHTD_PYTHON
uptime > $out/uptime-before.txt
for m in /var/tmp/ck130 /var/tmp/ck500 /var/tmp/ck50k; do
  name=$(basename $m); D=$(mktemp -d /tmp/wd-ap-XXXX)
  cat $m/*.safetensors > /dev/null
  node dist/main.js --model $m --device host --weight-cache-socket-dir $D > $out/daemon-$name.log 2>&1 & P=$!
  for i in $(seq 900); do grep -q '"ready":true' $out/daemon-$name.log && break; sleep 0.1; done
  $PY bench/attach-pair.py --socket-dir $D --before /tmp/h15b-before/clients/python --device host --runs 12 --out $out/attach-pair-$name.jsonl > $out/attach-pair-$name.txt
  kill -TERM $P; wait $P || true
done
uptime > $out/uptime-middle.txt
cat /var/tmp/host-4g/*.safetensors > /dev/null
node dist/bench/ready.js --model /var/tmp/host-4g --out $out/ready-4g --device host --runs 3 --tp 1,2 > $out/ready-4g.log 2>&1
uptime > $out/uptime-after.txt
