#!/usr/bin/env bash
# The fill with full-content digests (docs/spec/fingerprint.md §8) against the fill without, on
# one H200, hot page cache, in one process: fill-bench.mjs alternates blocks of 3 fills without
# and 3 with (`{"digest":true}`) ten times, so drift hits both alike. The same build does both: a
# fill given no tensor ranges hashes nothing and cuts its windows as before. Target: within 2%.
# Also: the pair with 12 lanes instead of 8 (threads 12 and the staging to feed them: the staging
# budget, not `threads`, bounds the lanes, native/cuda_copy_engine.cpp), which shows whether the
# lanes' CPU time is what the digests cost; and a cold pair (page cache dropped before each fill,
# O_DIRECT as the daemon chooses cold).
# With WEIGHTD_REF_ADDON (another build's weightd.node, e.g. main's before a change) the hot pairs
# run with it too, labelled ref-*: before and after on one machine in one session.
# Run from the repository root with build/Release/weightd.node and dist/ built; writes to $OUT:
#   fill-digest.jsonl (fill-bench lines), summary.json (median GB/s each way and ratio, per label
#   and options).
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
nvidia-smi -L; nproc
echo "== $(date +%T) checkpoint"
timeout 180 python3 bench/gpu/make-checkpoint.py --out "$CKPT" --gib "$GIB" --shards 4
cat "$CKPT"/*.safetensors > /dev/null
pairs=$(node -p 'JSON.stringify(Array.from({ length: 20 }, (_, i) => (i % 2 ? { digest: true } : {})))')
lanes='[{"threads":12,"stagingBytes":50331648},{"threads":12,"stagingBytes":50331648,"digest":true}]'
hot() { # label
  echo "== $(date +%T) $1: 10 alternating blocks of 3 fills, without / with digests; then 12 lanes"
  timeout 100 node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 3 --configs "$pairs" --label "$1-hot" --out "$OUT/fill-digest.jsonl"
  timeout 45 node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 5 --configs "$lanes" --label "$1-lanes12" --out "$OUT/fill-digest.jsonl"
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
cold='[{"direct":true,"chunkBytes":8388608,"stagingBytes":134217728},{"direct":true,"chunkBytes":8388608,"stagingBytes":134217728,"digest":true}]'
for _ in 1 2 3; do
  timeout 45 node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 1 --cold --configs "$cold" --label this-cold --out "$OUT/fill-digest.jsonl"
done
node --input-type=module -e '
  const fs = await import("node:fs");
  const lines = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => JSON.parse(l));
  const median = (a) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)]; };
  const out = {};
  const base = (o) => { const { digest, ...rest } = o; return JSON.stringify(rest); };
  for (const label of new Set(lines.map((l) => l.label))) {
    const of = (key, digest) => lines.filter((l) => l.label === label && base(l.results[0].options) === key && Boolean(l.results[0].options.digest) === digest)
      .flatMap((l) => l.results[0].runs.map((r) => l.payloadBytes / Math.max(...r.deviceSeconds) / 1e9));
    for (const key of new Set(lines.filter((l) => l.label === label).map((l) => base(l.results[0].options)))) {
      const [without, withDigest] = [of(key, false), of(key, true)];
      out[`${label} ${key}`] = { fills: [without.length, withDigest.length], medianGBpsWithout: median(without), medianGBpsWith: median(withDigest), ratio: median(withDigest) / median(without) };
    }
  }
  out.target = "this-hot ratio >= 0.98";
  fs.writeFileSync(process.argv[2], JSON.stringify(out, null, 1));
  console.log(JSON.stringify(out, null, 1));
' "$OUT/fill-digest.jsonl" "$OUT/summary.json"
