#!/bin/bash
# 2026-12-03, the development VM (2 cores, shared), host backend, hot page cache. The first attach
# of a fresh process (torch imported first) with the Python client of main at 918be10 (before)
# and of main at af6a9f8 and later (after: a strided view per tensor of one byte tensor per
# segment), paired, alternating, against one daemon (main's dist), at 50,438 tensors and at the
# bundled example's 39.
#   before: git worktree add --detach /tmp/h15-before 918be10 (its clients/python)
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-03-host-attach-50k
PY=${WEIGHTD_PYTHON:-.venv/bin/python}
[ -f /var/tmp/ck50k/model.safetensors.index.json ] || $PY bench/gpu/make-checkpoint.py --out /var/tmp/ck50k --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 > $out/make-checkpoint.txt
uptime > $out/uptime-before.txt
for m in ${MODELS:-/var/tmp/ck50k examples/tiny-llama}; do
  name=$(basename $m); D=$(mktemp -d /tmp/wd-ap-XXXX)
  node dist/main.js --model $m --device host --weight-cache-socket-dir $D > $out/daemon-$name.log 2>&1 & P=$!
  for i in $(seq 600); do grep -q '"ready":true' $out/daemon-$name.log && break; sleep 0.1; done
  $PY bench/attach-pair.py --socket-dir $D --before /tmp/h15-before/clients/python --device host --runs 6 --out $out/attach-pair-$name.jsonl > $out/attach-pair-$name.txt
  kill -TERM $P; wait $P || true
done
uptime > $out/uptime-after${MODELS:+-2}.txt
# Run again at 13:15 UTC for ~130 and ~500 tensors (uptime-before is that run's; the first run's
# was 12:27:49, load 2.24):
#   make-checkpoint.py --out /var/tmp/ck130 --gib 1.3 --hidden 2048 --inter 5632 --kv 512 --vocab 32000 --shards 2  (128 tensors)
#   make-checkpoint.py --out /var/tmp/ck500 --gib 1.3 --hidden 1024 --inter 2816 --kv 256 --vocab 32000 --shards 2  (533 tensors)
#   MODELS="/var/tmp/ck130 /var/tmp/ck500" bash run.sh
