#!/usr/bin/env bash
# Does DMA from the page cache (register) add to pread when both run at once? 2 GPUs, disjoint.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
date -u; nvidia-smi -L
CK=/var/tmp/ck8
python3 bench/gpu/make-checkpoint.py --out $CK --gib 8 --shards 4 > /dev/null
cat $CK/*.safetensors > /dev/null
F=$(ls $CK/*.safetensors | paste -sd,)
P() { timeout 60 ./.device/copy-probe --files "$F" --reps 3 --chunk-mib 2 --engine shared "$@" | tee -a $OUT/hybrid.jsonl | python3 -c "import sys,json; r=[json.loads(l) for l in sys.stdin]; print(sys.argv[1:], max(x['GBps'] for x in r))" "$@"; }
P --gpus 0 --share whole --mode pread --threads 8
P --gpus 0,1 --share split --mode pread --threads 16
P --gpus 0,1 --share split --mode register --threads 8 --reg-run 16
P --gpus 0,1 --share split --mode hybrid --threads 20 --reg-threads 4 --reg-run 16
P --gpus 0,1 --share split --mode hybrid --threads 16 --reg-threads 4 --reg-run 16
P --gpus 0,1 --share split --mode hybrid --threads 24 --reg-threads 8 --reg-run 16
P --gpus 0,1 --share split --mode hybrid --threads 20 --reg-threads 4 --reg-run 32
P --gpus 0,1 --share split --mode hybrid --threads 18 --reg-threads 2 --reg-run 16
P --gpus 0 --share whole --mode hybrid --threads 10 --reg-threads 2 --reg-run 16
P --gpus 0 --share whole --mode pread --threads 8
