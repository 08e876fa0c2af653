#!/bin/bash
# 2026-12-05, the development VM (2 cores, shared with other sessions), host backend, hot page
# cache, 50,438 tensors (+1 alias). The collector change alone: the first attach of a fresh
# process with the Python client of branch h33attach at ec47a5c (before: the packed manifest,
# the collector re-enabled as it was) and at the branch's head (after: the attach's objects moved
# to the oldest generation when the pause ends, the payload not copied), paired and alternating,
# against one daemon of the branch.
#   before: mkdir /tmp/h33-f20 && git archive ec47a5c clients/python | tar -x -C /tmp/h33-f20
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-host-attach-collector
PY=${WEIGHTD_PYTHON:-.venv/bin/python}
git rev-parse HEAD > $out/commit.txt; uptime > $out/uptime-before.txt
D=$(mktemp -d /tmp/wd-ab-XXXX)
node dist/main.js --model /var/tmp/ck50k --device host --weight-cache-socket-dir $D > $out/daemon.log 2>&1 & P=$!
for i in $(seq 900); do grep -q '"ready":true' $out/daemon.log && break; sleep 0.1; done
$PY bench/attach-pair.py --socket-dir $D --before /tmp/h33-f20/clients/python --device host --runs 10 --out $out/attach-pair.jsonl > $out/attach-pair.txt
uptime > $out/uptime-after.txt
kill -TERM $P; wait $P || true
