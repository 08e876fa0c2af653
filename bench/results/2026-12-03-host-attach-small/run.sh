#!/bin/bash
# 2026-12-03 ~15:25 UTC, the development VM (2 cores), host backend, hot page cache, after a CI
# run ended: the small checkpoints' first attach again (see ../2026-12-03-host-columns-rerun,
# whose 15:01 run was 3-4x slower with either client), 12 pairs each, client of 8526fb1 (before,
# /tmp/h15b-before/clients/python) against this commit's (after), one daemon of main at 3dd0af4
# (src unchanged since), after one untimed attach each.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-03-host-attach-small
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-$PWD/.venv/bin/python}
uptime > $out/uptime-before.txt
for m in /var/tmp/ck130 /var/tmp/ck500; do
  name=$(basename $m); D=$(mktemp -d /tmp/wd-ap-XXXX)
  cat $m/*.safetensors > /dev/null
  node dist/main.js --model $m --device host --weight-cache-socket-dir $D > $out/daemon-$name.log 2>&1 & P=$!
  for i in $(seq 900); do grep -q '"ready":true' $out/daemon-$name.log && break; sleep 0.1; done
  $WEIGHTD_PYTHON bench/attach-pair.py --socket-dir $D --before /tmp/h15b-before/clients/python --device host --runs 12 --out $out/attach-pair-$name.jsonl > $out/attach-pair-$name.txt
  kill -TERM $P; wait $P || true
done
uptime > $out/uptime-after.txt
