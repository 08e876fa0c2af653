#!/bin/bash
# 2026-12-02, the development VM (2 cores Intel Xeon, 24 GiB), Node 20.20.2, host backend, hot page cache.
# before: main at 275d2e2 (built in /tmp/i15-base); after: branch i15 at 2b2a748 (host fill by pwrite).
# Checkpoints (bench/llamaCheckpoint.ts): 2g = LLAMA_8B_LAYER --gib 2 (2.27 GB, 39 tensors);
# 4g = SMALL_LLAMA --gib 4 (4.32 GB, 408 tensors, hidden 2048: the restart benchmark's shape).
# Each ready.js call: per run, a tp=1 then a tp=2 daemon (one node, all ranks), then `cp` of the
# same files into /dev/shm; wall clock from spawn on both sides.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-02-host-ready-tp
export WEIGHTD_PYTHON=${WEIGHTD_PYTHON:-/work/main/.venv/bin/python}
for size in 2g 4g; do
  model=bench/out/node-share-ckpt; [ $size = 4g ] && model=bench/out/host-4g
  WEIGHTD_BIN=/tmp/i15-base/dist/main.js node dist/bench/ready.js --model $model --out $out/$size-before --device host --runs 3 --tp 1,2
  node dist/bench/ready.js --model $model --out $out/$size-after --device host --runs 3 --tp 1,2
done
