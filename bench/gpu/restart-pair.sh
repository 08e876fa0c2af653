#!/usr/bin/env bash
# A cuda restart that adopts (bench/restart.ts --device cuda --cuda-handles fd), two builds paired in
# one device call, their order alternating: this checkout ("new") against BASE_TAR ("base"), a
# tar.xz of another checkout's weightd, package.json, scripts/node-flags, dist (launch.cjs, main.cjs,
# its code cache, the rank thread's bundle where the build has one, main.js, src) and build/Release,
# made where it was built (with its addon built first, so that its bundle has its code cache):
#   tar cJf .devbase.tar.xz weightd package.json scripts/node-flags dist/launch.cjs dist/main.cjs \
#     dist/main.cjs.codecache dist/rank-thread.cjs dist/main.js dist/src build/Release
# Both use this checkout's runtime node_modules; the base its own GPU digest kernel where the tar
# holds one (build/Release/weightd-digests.fatbin: a kernel's job layout is its source's,
# native/gpu_digest_job.h), else this checkout's. Usage, on the GPU machine
# from the checkout's root, dist and node_modules in place:
#   bash bench/gpu/restart-pair.sh OUT [PAIRS] [BASE_TAR]
# Writes OUT/<base|new>-<pair>/ (restart.ts's raw.jsonl, daemon.jsonl, summary.json) and prints one
# line per run: adopted READY wall ms, CPU ms at READY, loaded READY wall ms, first attach ms.
set -uo pipefail
out=$1 pairs=${2:-4} base_tar=${3:-.devbase.tar.xz}
root=$(pwd)
source test/gpu/ensure-node.sh
source test/gpu/ensure-kernel.sh > /dev/null 2>&1
rm -rf /tmp/base && mkdir -p /tmp/base "$out" && tar xJf "$base_tar" -C /tmp/base || exit 2
ln -sfn "$root/node_modules" /tmp/base/node_modules
# A base built before its addon was (scripts/code-cache.mjs skips the cache without it) compiles
# its bundle at every start, ~50 ms on an H100: the pairing would measure that (2026-12-07 10:22).
if [ -f dist/main.cjs.codecache ] && [ ! -f /tmp/base/dist/main.cjs.codecache ]; then
  echo "warning: the base has no code cache for its bundle and this checkout has one: build the base with its addon in place, or its starts compile the bundle" >&2
fi
[ -f /tmp/base/build/Release/weightd-digests.fatbin ] || cp build/Release/weightd-digests.fatbin /tmp/base/build/Release/ 2>/dev/null
ck=${WEIGHTD_BENCH_CKPT:-/var/tmp/weightd-bench/ckpt}
[ -n "$(ls "$ck"/*.safetensors 2>/dev/null)" ] || python3 bench/gpu/make-checkpoint.py --out "$ck" --gib 8 --shards 4 > /dev/null
cat "$ck"/*.safetensors > /dev/null
for p in $(seq 1 "$pairs"); do
  order="base:/tmp/base new:$root"; [ $((p % 2)) = 0 ] && order="new:$root base:/tmp/base"
  for b in $order; do
    WEIGHTD_BIN=${b#*:}/weightd timeout 90 node dist/bench/restart.js --model "$ck" --out "$out/${b%%:*}-$p" --runs 1 --device cuda --cuda-handles fd > "$out/${b%%:*}-$p.log" 2>&1
    echo "${b%%:*} $p rc=$? $(node -p "const s=require('$out/${b%%:*}-$p/summary.json');[s.adoptedReadyWallMsMedian,s.adoptedCpuAtReadyMsMedian,s.loadedReadyWallMsMedian,s.firstAttachMsMedian].map(x=>Math.round(x*10)/10).join(' ')" 2>/dev/null)"
  done
done
