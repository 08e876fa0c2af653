#!/usr/bin/env bash
# The daemon's peak RSS to READY per V8 young-generation limit, each start in its own process.
#   bash bench/daemon-peak-rss.sh MODEL DEVICE OUTDIR [SEMI_MIB ...]   (default: 16 4 1; 16 is V8's own)
# Per start, one line in OUTDIR/peak-rss.jsonl: semiMiB, run, VmHWM/RssAnon/RssFile at READY (KiB),
# READY's sinceStartMs; the daemon's log beside it. Runs each limit twice, alternating.
set -uo pipefail
cd "$(dirname "$0")/.."
model=$1 device=$2 out=$3; shift 3
semis=${*:-16 4 1}
mkdir -p "$out"
for run in 1 2; do
  for semi in $semis; do
    log="$out/daemon-semi$semi-run$run.log"; D=$(mktemp -d /tmp/wd-rss-XXXX)
    node --max-semi-space-size="$semi" dist/main.js --model "$model" --device "$device" --weight-cache-socket-dir "$D" > "$log" 2>&1 & P=$!
    for _ in $(seq 1200); do grep -q '"ready":true' "$log" && break; kill -0 $P 2>/dev/null || break; sleep 0.05; done
    kb() { grep "^$1:" "/proc/$P/status" | tr -dc 0-9; }
    ready=$(grep -o '"sinceStartMs":[0-9]*,"ready"' "$log" | tr -dc 0-9)
    echo "{\"semiMiB\":$semi,\"run\":$run,\"VmHWM\":$(kb VmHWM),\"RssAnon\":$(kb RssAnon),\"RssFile\":$(kb RssFile),\"readySinceStartMs\":${ready:-null}}" | tee -a "$out/peak-rss.jsonl"
    kill -TERM $P; wait $P
  done
done
