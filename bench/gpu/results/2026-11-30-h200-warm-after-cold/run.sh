#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
mkdir -p /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node && export PATH=/tmp/nodebin:$PATH
ln -sfn .device/nm node_modules
CK=/var/tmp/ck8
python3 bench/gpu/make-checkpoint.py --out $CK --gib 8 --shards 4 > /dev/null
cat $CK/*.safetensors > /dev/null
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
load() { local label=$1 dio=$2 log=$OUT/d-$1.log; rm -rf /tmp/s-$label
  node dist/main.js --model $CK --device cuda -tp 1 --direct-io $dio --weight-cache-socket-dir /tmp/s-$label > $log 2>&1 &
  local pid=$!; for i in $(seq 1 600); do grep -q '^READY' $log && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  kill -TERM $pid; wait $pid; echo "$label: $(grep -o '"msg":"rank 0 loaded[^"]*"' $log)"; }
FB() { timeout 100 node bench/gpu/fill-bench.mjs --ckpt $CK --devices 0 --reps 3 --label $1 --configs '[{}]' 2>&1 >/dev/null | tail -1; }
FB bench-after-write
load daemon-after-write auto
load daemon-after-write-2 auto
drop; load daemon-cold-off off
load daemon-after-daemon-read auto
FB bench-after-daemon-read
drop; cat $CK/*.safetensors > /dev/null
load daemon-after-cat auto
FB bench-after-cat
