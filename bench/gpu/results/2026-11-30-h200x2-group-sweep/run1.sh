#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
exec > >(tee -a "$OUT/group.log") 2>&1
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node && export PATH=/tmp/nodebin:$PATH
ln -sfn .device/nm node_modules
CK=/var/tmp/ck8
date -u; nvidia-smi -L
python3 bench/gpu/make-checkpoint.py --out $CK --gib 8 --shards 4
cat $CK/*.safetensors > /dev/null
FB() { timeout 150 node bench/gpu/fill-bench.mjs --ckpt $CK --reps 3 --out $OUT/fills.jsonl "$@" > /dev/null; }
FB --devices 0 --label g-1gpu --configs '[{},{"threads":12},{"threads":16}]'
FB --devices 0,1 --tp 2 --label g-tp2 --configs '[{},{"group":true},{"group":true,"threads":12},{"group":true,"threads":16},{"group":true,"threads":16,"stagingBytes":67108864}]'
FB --devices 0,1 --label g-replicas --configs '[{},{"group":true},{"group":true,"threads":12},{"group":true,"threads":16}]'
FB --devices 0,1 --disjoint --label g-disjoint --configs '[{},{"group":true,"threads":16}]'
FB --devices 0 --label g-1gpu-again --configs '[{}]'
timeout 240 bash test/gpu/run.sh --only check --ckpt $CK --out $OUT/gpu-check.json 2>&1 | tail -30
echo done
