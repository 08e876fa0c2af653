#!/bin/bash
# 2026-12-05, the development VM (2 cores, shared with other sessions), host backend, hot page
# cache, 50,438 tensors (+1 alias). The first attach of a fresh process with the Python client of
# main at d86c487 (before: JSON columns) and of branch h33attach (after: the packed manifest,
# docs/spec/manifest-packed.md), paired and alternating, against one daemon of the branch (which
# serves both forms), then 8 engines attaching at once against one alone, then where each
# build's attach goes (bench/attach-breakdown.py, 4 fresh processes each, alternating).
#   before: mkdir /tmp/h33-before && git archive d86c487 clients/python | tar -x -C /tmp/h33-before
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-host-attach-packed
PY=${WEIGHTD_PYTHON:-.venv/bin/python}
BEFORE=/tmp/h33-before/clients/python
[ -f /var/tmp/ck50k/model.safetensors.index.json ] || $PY bench/gpu/make-checkpoint.py --out /var/tmp/ck50k --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 > $out/make-checkpoint.txt
git rev-parse HEAD > $out/commit.txt; uptime > $out/uptime-before.txt
D=$(mktemp -d /tmp/wd-ab-XXXX)
node dist/main.js --model /var/tmp/ck50k --device host --weight-cache-socket-dir $D > $out/daemon.log 2>&1 & P=$!
for i in $(seq 900); do grep -q '"ready":true' $out/daemon.log && break; sleep 0.1; done
$PY bench/attach-pair.py --socket-dir $D --before $BEFORE --device host --runs 10 --out $out/attach-pair.jsonl > $out/attach-pair.txt
uptime > $out/uptime-mid.txt
$PY bench/attach-concurrent.py --socket-dir $D --before $BEFORE --device host --engines 8 --runs 2 --out $out/attach-concurrent.jsonl > $out/attach-concurrent.txt
uptime > $out/uptime-mid2.txt
for i in 1 2 3 4; do
  for b in before after; do
    [ $b = before ] && C=$BEFORE || C=clients/python
    echo "{\"build\":\"$b\",\"row\":$(PYTHONPATH=$C $PY bench/attach-breakdown.py $D host)}" >> $out/breakdown.jsonl
  done
done
uptime > $out/uptime-after.txt
kill -TERM $P; wait $P || true
