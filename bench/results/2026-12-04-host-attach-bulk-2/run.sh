#!/bin/bash
# 2026-12-04, the development VM (2 cores, shared with other sessions), host backend, hot page
# cache, 50,438 tensors (+1 alias). The first attach of a fresh process with the Python client of
# main at 3959d98 (before) and of branch h33attach (after: views of repeating runs in bulk, with the commit "bulk_views: check only the part of a run not yet known"), paired
# and alternating, against one daemon of main's TypeScript (the branch changes none), then 8
# engines attaching at once against one alone.
#   before: git worktree add --detach /tmp/h33-before 3959d98 (its clients/python)
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-04-host-attach-bulk-2
PY=${WEIGHTD_PYTHON:-.venv/bin/python}
[ -f /var/tmp/ck50k/model.safetensors.index.json ] || $PY bench/gpu/make-checkpoint.py --out /var/tmp/ck50k --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 > $out/make-checkpoint.txt
git rev-parse HEAD > $out/commit.txt; uptime > $out/uptime-before.txt
D=$(mktemp -d /tmp/wd-ab-XXXX)
node dist/main.js --model /var/tmp/ck50k --device host --weight-cache-socket-dir $D > $out/daemon.log 2>&1 & P=$!
for i in $(seq 900); do grep -q '"ready":true' $out/daemon.log && break; sleep 0.1; done
$PY bench/attach-pair.py --socket-dir $D --before /tmp/h33-before/clients/python --device host --runs 8 --out $out/attach-pair.jsonl > $out/attach-pair.txt
uptime > $out/uptime-mid.txt
$PY bench/attach-concurrent.py --socket-dir $D --before /tmp/h33-before/clients/python --device host --engines 8 --runs 2 --out $out/attach-concurrent.jsonl > $out/attach-concurrent.txt
uptime > $out/uptime-after.txt
kill -TERM $P; wait $P || true
