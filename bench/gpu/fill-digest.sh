#!/usr/bin/env bash
# The fill with full-content digests (docs/spec/fingerprint.md §8) against the fill without, on
# one H200, hot page cache, in one process: fill-bench.mjs alternates blocks of 3 fills without,
# 3 with digests hashed on the GPU (`{"digest":true}`, native/cuda_digests.h) and 3 with digests
# hashed on the CPU (`{"digest":true,"digestOn":"cpu"}`, as before the GPU kernel) ten times, so
# drift hits all alike. The same build does all three: a fill given no tensor ranges hashes
# nothing and cuts its windows as before. The GPU digest kernel is built here first
# (test/gpu/ensure-kernel.sh); each fill records digestGpuBytes and, if it fell back to the CPU,
# why. Target: the GPU ratio within 2% (>= 0.98).
# Also: the pair with 12 lanes instead of 8 (threads 12 and the staging to feed them: the staging
# budget, not `threads`, bounds the lanes, native/cuda_copy_engine.cpp), which shows whether the
# lanes' CPU time is what the digests cost; and a cold pair (page cache dropped before each fill,
# O_DIRECT as the daemon chooses cold).
# With WEIGHTD_REF_ADDON (another build's weightd.node, e.g. main's before a change) the hot pairs
# run with it too, labelled ref-*: before and after on one machine in one session.
# Run from the repository root with build/Release/weightd.node and dist/ built; writes to $OUT:
#   fill-digest.jsonl (fill-bench lines), summary.json (median GB/s without, with GPU digests and
#   with CPU digests, and the ratios to without, per label and options).
# Environment: WEIGHTD_BENCH_CKPT (default /var/tmp/weightd-bench/ckpt), WEIGHTD_BENCH_GIB (8).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/bench/out}
CKPT=${WEIGHTD_BENCH_CKPT:-/var/tmp/weightd-bench/ckpt}
GIB=${WEIGHTD_BENCH_GIB:-8}
REF=${WEIGHTD_REF_ADDON:-}
ADDON=build/Release/weightd.node
mkdir -p "$OUT" "$CKPT"
exec > >(tee -a "$OUT/bench.log") 2>&1
source test/gpu/ensure-node.sh
source test/gpu/ensure-kernel.sh
nvidia-smi -L; nproc
echo "== $(date +%T) checkpoint"
timeout 180 python3 bench/gpu/make-checkpoint.py --out "$CKPT" --gib "$GIB" --shards 4
cat "$CKPT"/*.safetensors > /dev/null
triples=$(node -p 'JSON.stringify(Array.from({ length: 30 }, (_, i) => [{}, { digest: true }, { digest: true, digestOn: "cpu" }][i % 3]))')
lanes='[{"threads":12,"stagingBytes":50331648},{"threads":12,"stagingBytes":50331648,"digest":true},{"threads":12,"stagingBytes":50331648,"digest":true,"digestOn":"cpu"}]'
hot() { # label
  echo "== $(date +%T) $1: 10 alternating blocks of 3 fills, without / GPU digests / CPU digests; then 12 lanes"
  timeout 150 node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 3 --configs "$triples" --label "$1-hot" --out "$OUT/fill-digest.jsonl"
  timeout 60 node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 5 --configs "$lanes" --label "$1-lanes12" --out "$OUT/fill-digest.jsonl"
}
hot this
if [ -n "$REF" ] && [ ! -f "$REF" ]; then
  echo "WEIGHTD_REF_ADDON: no file at $REF; the ref pairs are skipped"
elif [ -n "$REF" ]; then
  cp "$ADDON" "$OUT/.this.node"
  cp "$REF" "$ADDON" && hot ref
  cp "$OUT/.this.node" "$ADDON" && rm "$OUT/.this.node"
fi
echo "== $(date +%T) cold: 3 alternating fills each way (O_DIRECT, 8 MiB chunks, as a cold daemon load)"
cold='[{"direct":true,"chunkBytes":8388608,"stagingBytes":134217728},{"direct":true,"chunkBytes":8388608,"stagingBytes":134217728,"digest":true},{"direct":true,"chunkBytes":8388608,"stagingBytes":134217728,"digest":true,"digestOn":"cpu"}]'
for _ in 1 2 3; do
  timeout 45 node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 1 --cold --configs "$cold" --label this-cold --out "$OUT/fill-digest.jsonl"
done
node bench/gpu/fill-digest-summary.mjs "$OUT/fill-digest.jsonl" "$OUT/summary.json"
