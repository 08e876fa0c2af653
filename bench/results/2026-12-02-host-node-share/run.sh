#!/bin/bash
# 2026-12-02, the development VM (2 cores Intel Xeon, 24 GiB, ext4 on virtio /dev/vda), Node 20.20.2.
# before: main at 275d2e2 (git archive into /tmp/i15-base, built there: npm run build);
# after:  branch i15 at 2b2a748. Checkpoint: bench/llamaCheckpoint.ts LLAMA_8B_LAYER, --gib 2
# (4 layers of Llama-3-8B's shapes, vocab 32000: 2.27 GB, 39 tensors), a copy per node for the cold runs.
set -e
cd "$(dirname "$0")/../../.."
node dist/bench/node-share.js --out bench/results/2026-12-02-host-node-share/out --gib 2 --baseline /tmp/i15-base --runs 2 --modes cold,hot
