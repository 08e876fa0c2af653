#!/usr/bin/env bash
# Cold and warm daemon loads of an 8.56 GB checkpoint, --direct-io auto vs off, tp=1 and tp=2.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
mkdir -p /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node && export PATH=/tmp/nodebin:$PATH
ln -sfn .device/nm node_modules
export NCCL_NVLS_ENABLE=0
CK=/var/tmp/ck8
date -u; nvidia-smi -L; df -hT /var/tmp | tail -1
python3 bench/gpu/make-checkpoint.py --out $CK --gib 8 --shards 4
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
load() { # label tp direct-io cold(0/1)
  local label=$1 tp=$2 dio=$3 cold=$4 log=$OUT/daemon-$1.log
  [ "$cold" = 1 ] && drop
  rm -rf /tmp/sock-$label
  node dist/main.js --model $CK --device cuda -tp $tp --direct-io $dio --weight-cache-socket-dir /tmp/sock-$label > $log 2>&1 &
  local pid=$!
  for i in $(seq 1 600); do grep -q '^READY' $log && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  kill -TERM $pid; wait $pid; echo "$label exit=$?"
  grep -o '"msg":"\(all [0-9]* local ranks loaded[^"]*\|the page cache holds[^"]*\)"' $log
}
load tp1-cold-auto 1 auto 1
load tp1-cold-off 1 off 1
load tp1-warm-auto 1 auto 0
load tp2-cold-auto 2 auto 1
load tp2-cold-off 2 off 1
load tp2-warm-auto 2 auto 0
drop; t0=$(date +%s.%N); cat $CK/*.safetensors > /dev/null; t1=$(date +%s.%N)
node -e "console.log('cat cold GB/s', (8556719696 / ($t1 - $t0) / 1e9).toFixed(3))"
echo done
