#!/bin/bash
# starts.sh BLOB PAIRS: loading starts of the example on the host backend, the bundle through
# dist/launch.cjs (its code cache) against the snapshot, alternating; each start's "control
# socket" sinceStartMs (the first log line: Node's start, the bundle, the command line) and, for
# the launcher, READY's (from the snapshot the rank fails before READY: see README.md).
blob=$1 pairs=$2
for i in $(seq $pairs); do
  for v in launch snapshot; do
    D=$(mktemp -d /tmp/wdsn-XXXX)
    if [ $v = snapshot ]; then node --max-semi-space-size=1 --snapshot-blob "$blob" -- --model examples/tiny-llama --device host --weight-cache-socket-dir $D > $D/log 2>&1 & P=$!
    else node --max-semi-space-size=1 dist/launch.cjs --model examples/tiny-llama --device host --weight-cache-socket-dir $D > $D/log 2>&1 & P=$!; fi
    for k in $(seq 500); do grep -q '"ready":true\|node ended' $D/log && break; sleep 0.01; done
    kill -TERM $P 2>/dev/null; wait $P
    sock=$(grep -o '"sinceStartMs":[0-9]*,"socket":"[^"]*control' $D/log | grep -o 'Ms":[0-9]*' | tr -dc 0-9)
    ready=$(grep -o '"sinceStartMs":[0-9]*,"ready"' $D/log | tr -dc 0-9)
    echo "{\"run\":\"$v-$i\",\"controlSocketMs\":${sock:-null},\"readyMs\":${ready:-null}}"
    rm -rf $D
  done
done
