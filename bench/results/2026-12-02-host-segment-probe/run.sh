#!/bin/bash
# 2026-12-02, the development VM (2 cores Intel Xeon, 24 GiB), kernel 6.18, shmem_enabled=never.
# Ways of filling a memfd segment from a warm page cache, outside the daemon, on the 2.27 GB
# checkpoint of bench/results/2026-12-02-host-node-share (3 files), 8 threads, 2 MiB chunks,
# then `cp` of the same files into /dev/shm (what bench/ready.ts compares READY with).
set -e
cd "$(dirname "$0")/../../.."
g++ -O2 -std=c++17 -o /tmp/segment-probe bench/host/segment-probe.cpp -lpthread
dir=bench/out/node-share-ckpt
cat $dir/*.safetensors > /dev/null
files=$(ls $PWD/$dir/*.safetensors | paste -sd,)
for mode in populate populate-T fault pwrite pwrite-nofalloc; do /tmp/segment-probe --files $files --mode $mode --threads 8 --reps 3; done
for i in 1 2 3; do d=$(mktemp -d /dev/shm/cp-XXXX); s=$(date +%s.%N); cp $dir/*.safetensors $d/; e=$(date +%s.%N); rm -rf $d; echo "{\"mode\":\"cp\",\"totalS\":$(echo "$e - $s" | bc)}"; done
