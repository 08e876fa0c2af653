#!/bin/bash
# startpair.sh OUT BASE PAIRS MODEL: control socket and READY sinceStartMs of a loading start, host backend, through each checkout's ./weightd, alternating.
out=$1 base=$2 pairs=$3 model=$4
: > $out
for i in $(seq $pairs); do
  order="base after"; [ $((i % 2)) = 0 ] && order="after base"
  for v in $order; do
    bin=/work/main/weightd; [ $v = base ] && bin=$base/weightd
    D=$(mktemp -d /tmp/wdsp-XXXX)
    $bin --model $model --device host --weight-cache-socket-dir $D > $D/log 2>&1 & P=$!
    for k in $(seq 1000); do grep -q '"ready":true' $D/log && break; sleep 0.01; done
    cpu=$(awk '{print ($14+$15)*10}' /proc/$P/stat)
    kill -TERM $P; wait $P
    sock=$(grep -o '"sinceStartMs":[0-9]*,"socket":"[^"]*control' $D/log | grep -o 'Ms":[0-9]*' | tr -dc 0-9)
    ready=$(grep -o '"sinceStartMs":[0-9]*,"ready"' $D/log | tr -dc 0-9)
    echo "{\"run\":\"$v-$i\",\"controlSocketMs\":$sock,\"readyMs\":$ready,\"cpuAtReadyMs\":$cpu}" >> $out
    rm -rf $D
  done
done
