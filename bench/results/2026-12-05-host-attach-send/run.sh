#!/bin/bash
# 2026-12-05 23:3x, the development VM (2 cores, shared), host backend, /var/tmp/ck50k (50,438
# tensors + 1 alias, bench/results/2026-12-05-host-attach-round3/run.sh makes it). The packed
# get_state's frames as a fresh engine process reads them (get-packed.py, the Python client's own
# reader), from this checkout's daemon and from a bare Node server that writes the same sizes in
# one corked write (bare-server.mjs): PAIRS pairs, alternating which goes first, load recorded,
# and each server's main-thread CPU over the series (server-cpu.txt; added for run 2, so run 1, this
# folder, has none). A second series: OUT=<this folder>/run-2.
set -e
cd "$(dirname "$0")/../../.."
here=bench/results/2026-12-05-host-attach-send
out=${OUT:-$here}
PY=${WEIGHTD_PYTHON:-/work/main/.venv/bin/python}
export PYTHONPATH=$PWD/clients/python
git rev-parse HEAD > $out/commit.txt
D=$(mktemp -d /tmp/wd-hsend-XXXX)
node dist/main.js --model /var/tmp/ck50k --device host --weight-cache-socket-dir $D > $out/daemon.log 2>&1 & P=$!
node $here/bare-server.mjs $D/bare.sock > /dev/null 2>&1 & B=$!
for i in $(seq 900); do grep -q '"ready":true' $out/daemon.log && break; sleep 0.1; done
SOCK=$(ls $D/*.sock | grep -v -e control- -e bare.sock)
FP=$($PY -c "import sys; from weightd_client import WeightdClient; print(WeightdClient(sys.argv[1]).ping()['fingerprint'])" $SOCK)
$PY $here/get-packed.py $SOCK $FP > /dev/null; $PY $here/get-packed.py $D/bare.sock $FP > /dev/null  # untimed
uptime > $out/uptime-before.txt
cpu() { echo "$1 $(awk '{print $14+$15}' /proc/$P/task/$P/stat) $(awk '{print $14+$15}' /proc/$B/task/$B/stat)"; }  # main threads' CPU, jiffies
cpu before > $out/server-cpu.txt
: > $out/send-pair.jsonl
for pair in $(seq ${PAIRS:-12}); do
  order="daemon bare"; [ $((pair % 2)) = 0 ] && order="bare daemon"
  for who in $order; do
    [ $who = daemon ] && S=$SOCK || S=$D/bare.sock
    echo "{\"pair\":$pair,\"server\":\"$who\",\"row\":$($PY $here/get-packed.py $S $FP)}" >> $out/send-pair.jsonl
  done
done
uptime > $out/uptime-after.txt
cpu after >> $out/server-cpu.txt  # columns: when, daemon's main thread, bare server's (1/100 s)
kill -TERM $P $B; wait $P || true
rm -rf $D
