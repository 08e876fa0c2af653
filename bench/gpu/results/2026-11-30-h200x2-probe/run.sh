#!/usr/bin/env bash
# One device call: warm 8.56 GB checkpoint, copy-probe matrix, current engine baselines.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
exec > >(tee -a "$OUT/probe.log") 2>&1
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node && export PATH=/tmp/nodebin:$PATH
ln -sfn .device/nm node_modules
nvidia-smi -L; lscpu | grep -iE "model name|cache|^CPU\(s\)|numa"; free -g | head -2; uname -r
CK=/var/tmp/ck8
python3 bench/gpu/make-checkpoint.py --out $CK --gib 8 --shards 4
cat $CK/*.safetensors > /dev/null
F=$(ls $CK/*.safetensors | paste -sd,)
P() { timeout 60 ./.device/copy-probe --files "$F" --reps 3 "$@" | tee -a $OUT/probe.jsonl; }
# one GPU
P --gpus 0 --mode pread --share whole --engine shared --threads 8 --chunk-mib 2
P --gpus 0 --mode pread --share whole --engine shared --threads 16 --chunk-mib 2
for c in 2 8 32; do P --gpus 0 --mode register --share whole --engine shared --threads 8 --chunk-mib $c; done
P --gpus 0 --mode register --share whole --engine shared --threads 16 --chunk-mib 8
P --gpus 0 --mode register --share whole --engine shared --threads 16 --chunk-mib 32
for c in 2 8 64; do P --gpus 0 --mode pin --share whole --engine shared --threads 8 --chunk-mib $c; done
P --gpus 0 --mode pin --share whole --engine shared --threads 16 --chunk-mib 8
# two GPUs, disjoint (tp-like)
P --gpus 0,1 --mode pread --share split --engine separate --threads 8 --chunk-mib 2
P --gpus 0,1 --mode pread --share split --engine separate --threads 4 --chunk-mib 2
P --gpus 0,1 --mode pread --share split --engine shared --threads 8 --chunk-mib 2
P --gpus 0,1 --mode pread --share split --engine shared --threads 16 --chunk-mib 2
P --gpus 0,1 --mode pread --share split --engine shared --threads 12 --chunk-mib 1
P --gpus 0,1 --mode register --share split --engine shared --threads 8 --chunk-mib 8
P --gpus 0,1 --mode register --share split --engine shared --threads 16 --chunk-mib 8
P --gpus 0,1 --mode register --share split --engine shared --threads 16 --chunk-mib 32
P --gpus 0,1 --mode register --share split --engine separate --threads 8 --chunk-mib 8
# two GPUs, replicas
P --gpus 0,1 --mode pread --share whole --engine separate --threads 8 --chunk-mib 2
P --gpus 0,1 --mode pread --share whole --engine shared --threads 8 --chunk-mib 2
P --gpus 0,1 --mode pread --share whole --engine shared --threads 16 --chunk-mib 2
P --gpus 0,1 --mode register --share whole --engine shared --threads 8 --chunk-mib 8
P --gpus 0,1 --mode register --share whole --engine shared --threads 16 --chunk-mib 16
# current engine, same run
timeout 60 node bench/gpu/fill-bench.mjs --ckpt $CK --devices 0 --reps 3 --label cur-1gpu --configs '[{}]' --out $OUT/fills.jsonl >/dev/null
timeout 60 node bench/gpu/fill-bench.mjs --ckpt $CK --devices 0,1 --tp 2 --reps 3 --label cur-tp2 --configs '[{}]' --out $OUT/fills.jsonl >/dev/null
echo done
