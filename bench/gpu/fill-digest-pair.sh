#!/usr/bin/env bash
# Issue 29's target on a GPU, two builds of the addon paired in one device call: the fill with
# full-content digests hashed on the GPU against the fill without, hot page cache, tp=1, for this
# checkout's build/Release/weightd.node ("this") and REF ("ref": another build's weightd.node,
# e.g. main's before a change), in alternating processes, ROUNDS of each (default 2). Each process
# runs fill-bench.mjs with 10 blocks of 3 fills without digests, then 3 with, so drift hits both
# ways alike; "this" uses this checkout's GPU digest kernel (built here first), "ref" REF_KERNEL
# where given (a kernel's job layout is its source's: an addon finds no kernel in another layout's
# file, native/gpu_digest_job.h), else this checkout's.
# Usage, from the repository root on the GPU machine, dist/ and node_modules in place:
#   bash bench/gpu/fill-digest-pair.sh OUT REF [ROUNDS] [REF_KERNEL]
# Writes OUT/fill-digest.jsonl (fill-bench lines, labelled this-N / ref-N) and OUT/summary.json
# (fill-digest-summary.mjs). Environment: WEIGHTD_BENCH_CKPT (default /var/tmp/weightd-bench/ckpt,
# made if missing: 8 GiB, 4 shards).
set -uo pipefail
out=$1 ref=$2 rounds=${3:-2} ref_kernel=${4:-}
root=$(pwd)
ck=${WEIGHTD_BENCH_CKPT:-/var/tmp/weightd-bench/ckpt}
addon=build/Release/weightd.node
[ -f "$ref" ] || { echo "no addon at $ref" >&2; exit 2; }
mkdir -p "$out"
source test/gpu/ensure-node.sh
source test/gpu/ensure-kernel.sh > "$out/kernel.log" 2>&1
[ -n "$(ls "$ck"/*.safetensors 2>/dev/null)" ] || timeout 180 python3 bench/gpu/make-checkpoint.py --out "$ck" --gib 8 --shards 4 > /dev/null
cat "$ck"/*.safetensors > /dev/null
cp "$addon" "$out/.this.node"
trap 'cp "$out/.this.node" "$addon" && rm -f "$out/.this.node"' EXIT
blocks=$(node -p 'JSON.stringify(Array.from({ length: 20 }, (_, i) => (i % 2 ? { digest: true } : {})))')
for r in $(seq 1 "$rounds"); do
  order="this ref"; [ $((r % 2)) = 0 ] && order="ref this"
  for b in $order; do
    kernel=()
    if [ "$b" = this ]; then cp "$out/.this.node" "$addon"; else cp "$ref" "$addon"; [ -n "$ref_kernel" ] && kernel=(WEIGHTD_DIGEST_KERNEL="$ref_kernel"); fi
    env "${kernel[@]}" timeout 120 node bench/gpu/fill-bench.mjs --ckpt "$ck" --devices 0 --reps 3 --configs "$blocks" --label "$b-$r" --out "$out/fill-digest.jsonl" > /dev/null 2>> "$out/fill.err"
    echo "$b $r rc=$?"
  done
done
node bench/gpu/fill-digest-summary.mjs "$out/fill-digest.jsonl" "$out/summary.json" > /dev/null
node -e 'const s = require(process.argv[1]); for (const [k, v] of Object.entries(s)) if (v.fills) console.log(k, "without", v.medianGBpsWithout.toFixed(2), "GPU digests", v.medianGBpsGpuDigests.toFixed(2), "ratio", v.ratioGpu.toFixed(4), "blocks", v.blockRatiosGpu.median.toFixed(4), "setup ms", v.gpuSetupMsMedian, "tail ms", v.gpuTailMsMedian)' "$out/summary.json"
