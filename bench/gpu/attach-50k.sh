#!/usr/bin/env bash
# Issue 33 on a GPU host, one device call (about 6 minutes): the first attach of a fresh process at
# 50,438 tensors (+1 alias) with two builds of the Python client, every view touched, paired;
# 8 engines attaching at once against one alone; where one attach goes; and the daemon's peak RSS
# at 50k with the young generation at V8's default (16 MiB semi-spaces) against 4 and 1 MiB.
# Run from the repository root with build/Release/weightd.node and dist/ built here, the old
# client's package in $WEIGHTD_BEFORE_CLIENT (default .device/before-client: a copy of main's
# clients/python, e.g. cp -r /tmp/main-wt/clients/python .device/before-client) and Node in
# .device/node.xz (shared/device/pack-node.sh). Writes to $OUT (default bench/out/attach-50k):
#   attach-pair.{jsonl,txt}        fresh-process first attach, before/after, 8 pairs
#   attach-concurrent.{jsonl,txt}  8 engines at once against one, 3 runs per build
#   breakdown.jsonl                the after client's attach split in steps (3 fresh processes)
#   rss/peak-rss.jsonl             bench/daemon-peak-rss.sh: the daemon's VmHWM at READY and
#                                  READY's sinceStartMs, semi-spaces 16 (V8's) / 4 / 1 MiB, 2 runs each
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/bench/out/attach-50k}
BEFORE=${WEIGHTD_BEFORE_CLIENT:-.device/before-client}
CKPT=${WEIGHTD_BENCH_CKPT:-/var/tmp/ck50k}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
source test/gpu/ensure-node.sh
step() { echo "== $(date +%T) $*"; }
[ -d "$BEFORE/weightd_client" ] || { echo "no old client in $BEFORE (WEIGHTD_BEFORE_CLIENT)"; exit 2; }
date -u > "$OUT/date.txt"; nproc >> "$OUT/date.txt"; nvidia-smi -L >> "$OUT/date.txt"; git rev-parse HEAD >> "$OUT/date.txt" 2>/dev/null
step "checkpoint"
[ -f "$CKPT/model.safetensors.index.json" ] || timeout 120 python3 bench/gpu/make-checkpoint.py --out "$CKPT" --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4
cat "$CKPT"/*.safetensors > /dev/null

step "daemon peak RSS per young-generation limit"
timeout 150 bash bench/daemon-peak-rss.sh "$CKPT" cuda "$OUT/rss" 16 4 1

step "daemon (run by ./weightd, with its flags: scripts/node-flags)"
D=$(mktemp -d /tmp/wd50k-XXXX)
./weightd --model "$CKPT" --device cuda --weight-cache-socket-dir "$D" > "$OUT/daemon.log" 2>&1 & DP=$!
for _ in $(seq 600); do grep -q '"ready":true' "$OUT/daemon.log" && break; sleep 0.05; done
step "attach pairs (8), before/after clients"
timeout 200 python3 bench/attach-pair.py --socket-dir "$D" --before "$BEFORE" --device cuda --runs 8 --out "$OUT/attach-pair.jsonl" > "$OUT/attach-pair.txt"; cat "$OUT/attach-pair.txt"
step "8 engines at once against one"
timeout 150 python3 bench/attach-concurrent.py --socket-dir "$D" --before "$BEFORE" --device cuda --engines 8 --runs 3 --out "$OUT/attach-concurrent.jsonl" > "$OUT/attach-concurrent.txt"; cat "$OUT/attach-concurrent.txt"
step "breakdown (after client)"
for _ in 1 2 3; do PYTHONPATH=clients/python timeout 60 python3 bench/attach-breakdown.py "$D" cuda >> "$OUT/breakdown.jsonl"; done; cat "$OUT/breakdown.jsonl"
grep -E '^(VmHWM|RssAnon)' "/proc/$DP/status" > "$OUT/daemon-rss-after-attaches.txt"
kill -TERM "$DP"; wait "$DP"
nvidia-smi --query-gpu=memory.used --format=csv > "$OUT/gpu-after.csv"
