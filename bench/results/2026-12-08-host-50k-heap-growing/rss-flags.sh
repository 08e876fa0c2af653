#!/bin/bash
model=$1 dev=$2 runs=$3; shift 3
for r in $(seq $runs); do for fl in "$@"; do
  D=$(mktemp -d /tmp/wdr-XXXX); log=$D/log
  node $fl /work/main/dist/main.js --model $model --device $dev --weight-cache-socket-dir $D > $log 2>&1 & P=$!
  for _ in $(seq 1200); do grep -q '"ready":true' $log && break; kill -0 $P 2>/dev/null || break; sleep 0.02; done
  kb() { grep "^$1:" /proc/$P/status | tr -dc 0-9; }
  cpu=$(awk '{print ($14+$15)*10}' /proc/$P/stat)
  ready=$(grep -o '"sinceStartMs":[0-9]*,"ready"' $log | tr -dc 0-9)
  echo "$fl | hwm $(( $(kb VmHWM)/1024 )) anon $(( $(kb RssAnon)/1024 )) ready $ready cpu $cpu"
  kill -TERM $P; wait $P; rm -rf $D
done; done
