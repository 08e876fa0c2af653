#!/bin/bash
# 2026-12-03 15:08 UTC, the development VM (2 cores, load average 0.44-2.2), kernel 6.18: the
# segment probe's pwrite mode (bench/host/segment-probe.cpp; what the host fill does) on the
# 4.32 GB checkpoint of ../2026-12-03-host-columns-rerun, 8, 2 and 1 threads, 2 reps each, then
# `cp` into /dev/shm twice. Output copied from the terminal into probe.jsonl.
g++ -O2 -std=c++17 -o /tmp/segment-probe bench/host/segment-probe.cpp -lpthread
files=$(ls /var/tmp/host-4g/*.safetensors | paste -sd,); cat /var/tmp/host-4g/*.safetensors > /dev/null
for t in 8 2 1; do /tmp/segment-probe --files $files --mode pwrite --threads $t --reps 2; done
for i in 1 2; do d=$(mktemp -d /dev/shm/cp-XXXX); s=$(date +%s.%N); cp /var/tmp/host-4g/*.safetensors $d/; e=$(date +%s.%N); rm -rf $d; echo "{\"mode\":\"cp\",\"totalS\":$(echo "$e - $s" | bc)}"; done
