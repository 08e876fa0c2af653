#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
exec 2>&1
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node && export PATH=/tmp/nodebin:$PATH
ln -sfn .device/nm node_modules
CK=/var/tmp/ck8
date -u; nvidia-smi -L
python3 bench/gpu/make-checkpoint.py --out $CK --gib 8 --shards 4
cat $CK/*.safetensors > /dev/null
M=1048576
G() { echo "{\"group\":true,\"threads\":$1,\"stagingBytes\":$(($2 * M))}"; }
FB() { timeout 150 node bench/gpu/fill-bench.mjs --ckpt $CK --reps 3 --out $OUT/fills.jsonl "$@" > /dev/null; }
FB --devices 0 --label g-1gpu --configs "[{},{\"threads\":16,\"stagingBytes\":$((64*M))}]"
FB --devices 0,1 --tp 2 --label g-tp2 --configs "[{},{\"threads\":16,\"stagingBytes\":$((64*M))},$(G 8 32),$(G 12 48),$(G 16 64),$(G 24 96)]"
FB --devices 0,1 --label g-replicas --configs "[{},$(G 8 32),$(G 12 48),$(G 16 64)]"
FB --devices 0,1 --disjoint --label g-disjoint --configs "[{},$(G 16 64)]"
FB --devices 0 --label g-1gpu-again --configs '[{}]'
FB --devices 0,1 --tp 2 --reps 1 --label rss-tp2-group --configs "[$(G 16 64)]"
timeout 200 bash test/gpu/run.sh --only daemon --out-dir $OUT/daemon 2>&1 | tail -25
echo done
