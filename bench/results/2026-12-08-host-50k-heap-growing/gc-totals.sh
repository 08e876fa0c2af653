#!/bin/bash
# gc-totals.sh MODEL FLAGS...: one host start of dist/main.js per flag set with --trace-gc, to READY;
# prints the count and summed pause of its Mark-Compacts and Scavenges (both threads) and each
# Mark-Compact's heap before -> after.
model=$1; shift
for fl in "$@"; do
  D=$(mktemp -d); node --max-semi-space-size=1 $fl --trace-gc /work/main/dist/main.js --model $model --device host --weight-cache-socket-dir $D > $D/log 2>&1 & P=$!
  for _ in $(seq 1000); do grep -q '"ready":true' $D/log && break; sleep 0.02; done; kill $P; wait $P 2>/dev/null
  sum() { grep "$1" $D/log | grep -o 'MB, [0-9.]* / [0-9.]* ms' | awk '{s+=$2} END {printf "%.1f", s}'; }
  echo "flags [$fl] mark-compact $(grep -c Mark-Compact $D/log) pause-ms $(sum Mark-Compact) scavenge $(grep -c Scavenge $D/log) pause-ms $(sum Scavenge)"
  echo "  $(grep Mark-Compact $D/log | grep -o 'Mark-Compact [0-9.]* ([0-9.]*) -> [0-9.]* ([0-9.]*) MB' | sed 's/Mark-Compact //' | tr '\n' ';')"
  rm -rf $D
done
