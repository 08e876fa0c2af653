#!/bin/bash
# 2026-12-04, the development VM (2 cores, shared: load average 10-30 while it ran), host backend,
# hot page cache, 50,438 tensors (bench/gpu/make-checkpoint.py, as in 2026-12-04-host-attach-bulk).
cd "$(dirname "$0")/../../.."
uptime > bench/results/2026-12-04-host-peak-rss-50k/uptime-before.txt
bash bench/daemon-peak-rss.sh /var/tmp/ck50k host bench/results/2026-12-04-host-peak-rss-50k 16 4 1
uptime > bench/results/2026-12-04-host-peak-rss-50k/uptime-after.txt
