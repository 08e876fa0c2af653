#!/bin/bash
# 2026-12-05 evening, the development VM (2 cores, shared with other sessions), host backend, hot
# page cache, 50,438 tensors (+1 alias; /var/tmp/ck50k, made as below). The first attach of a
# fresh process with the Python client of main (before) and of branch hattach (after: views below
# autograd's view tracking, the packed manifest's numbers held as arrays, the run search on numpy
# columns, the names decoded 64 KiB at a time), paired and alternating, against one daemon of
# this checkout (its TypeScript is main's), then where each build's attach goes
# (bench/attach-breakdown.py: each step's wall, thread CPU and page faults; 4 fresh processes
# each, alternating), then 8 engines at once against one alone.
#   before: mkdir /tmp/hattach-before && git archive main clients/python | tar -x -C /tmp/hattach-before
set -e
cd "$(dirname "$0")/../../.."
out=${OUT:-bench/results/2026-12-05-host-attach-round3}  # a second series: OUT=<this folder>/run-2 NO_CONCURRENT=1
PY=${WEIGHTD_PYTHON:-/work/main/.venv/bin/python}
BEFORE=${BEFORE:-/tmp/hattach-before/clients/python}
[ -f /var/tmp/ck50k/model.safetensors.index.json ] || $PY bench/gpu/make-checkpoint.py --out /var/tmp/ck50k --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 > $out/make-checkpoint.txt
{ git rev-parse HEAD; git rev-parse main; } > $out/commit.txt
uptime > $out/uptime-before.txt
D=$(mktemp -d /tmp/wd-hattach-XXXX)
node dist/main.js --model /var/tmp/ck50k --device host --weight-cache-socket-dir $D > $out/daemon.log 2>&1 & P=$!
for i in $(seq 900); do grep -q '"ready":true' $out/daemon.log && break; sleep 0.1; done
$PY bench/attach-pair.py --socket-dir $D --before $BEFORE --device host --runs ${RUNS:-12} --out $out/attach-pair.jsonl > $out/attach-pair.txt
uptime > $out/uptime-mid.txt
for i in 1 2 3 4; do
  for b in before after; do
    [ $b = before ] && C=$BEFORE || C=clients/python
    echo "{\"build\":\"$b\",\"loadavg\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"row\":$(PYTHONPATH=$C $PY bench/attach-breakdown.py $D host)}" >> $out/breakdown.jsonl
  done
done
uptime > $out/uptime-mid2.txt
if [ -z "$NO_CONCURRENT" ]; then
  $PY bench/attach-concurrent.py --socket-dir $D --before $BEFORE --device host --engines 8 --runs 2 --out $out/attach-concurrent.jsonl > $out/attach-concurrent.txt
fi
uptime > $out/uptime-after.txt
kill -TERM $P; wait $P || true
rm -rf $D
