#!/bin/bash
# A restart across the upgrade, with a keeper: main's daemon (BASE, one segment a host rank) loads
# a 256 MiB checkpoint (test/helpers/sparseLlama.ts, 8 layers) and stops, leaving its shard with
# the keeper; this branch's daemon (AFTER) restarts on it, then again; then a fresh keeper and
# AFTER alone. Prints, per start, its READY line, whether it allocated (and in how many
# segments) or adopted, and where its plan came from.
# Usage: keeper-upgrade.sh WORKDIR   (WORKDIR must not exist)
set -e
work=$1
base=/tmp/hhostseg/base
after=/tmp/hhostseg/after
mkdir -p "$work/model" "$work/sock"
node -e "import('$after/dist/test/helpers/sparseLlama.js').then((m) => m.writeSparseLlama('$work/model', 8))"
export WEIGHTD_HOST_DEVICES=upgrade-dev-0
start() {
  local tree=$1 tag=$2
  "$tree/weightd" --model "$work/model" -tp 1 --device host --weight-cache-socket-dir "$work/sock" --keeper spawn --adopt-within 120 --log-level debug 2> "$work/$tag.log" &
  local pid=$!
  for _ in $(seq 1 600); do grep -q '"msg":"READY' "$work/$tag.log" && break; sleep 0.1; done
  kill -TERM $pid; wait $pid || true
  echo "== $tag ($tree)"
  grep -o '"msg":"READY[^"]*"' "$work/$tag.log"
  grep -o '"msg":"rank 0 allocated[^"]*"' "$work/$tag.log" || echo "(no allocation)"
  grep -o '"from":"[a-z]*","headersRead":[0-9]*' "$work/$tag.log" | head -1
  grep -o '"msg":"[^"]*kept[^"]*"' "$work/$tag.log" | head -3 || true
}
# The keeper this script's daemons spawned, ended by its pid (its PING's).
stop_keeper() {
  local pid
  pid=$(node -e "import('$after/dist/src/keeper/keeperClient.js').then(async ({ KeeperClient }) => { const k = new KeeperClient('$work/sock/keeper.sock'); console.log((await k.ping()).pid); k.close?.(); process.exit(0); })")
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}
start $base 1-base
start $after 2-after-over-base
start $after 3-after-again
stop_keeper
sleep 1
rm -rf "$work/sock"; mkdir "$work/sock"
start $after 4-after-fresh-keeper
start $after 5-after-over-after
stop_keeper
