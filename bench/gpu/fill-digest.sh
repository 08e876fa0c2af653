#!/usr/bin/env bash
# The fill with full-content digests (docs/spec/fingerprint.md §8) against the fill without, on
# one H200, hot page cache, in one process: fill-bench.mjs alternates blocks of 3 fills without
# and 3 with (`{"digest":true}`) ten times, so drift hits both alike. The same build does both: a
# fill given no tensor ranges hashes nothing and cuts its windows as before. Target: within 2%.
# Also a cold pair (page cache dropped before each fill, O_DIRECT as the daemon chooses cold).
# Run from the repository root with build/Release/weightd.node and dist/ built; writes to $OUT:
#   fill-digest.jsonl (fill-bench lines), summary.json (median GB/s each way, ratio).
# Environment: WEIGHTD_BENCH_CKPT (default /var/tmp/weightd-bench/ckpt), WEIGHTD_BENCH_GIB (8).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/bench/out}
CKPT=${WEIGHTD_BENCH_CKPT:-/var/tmp/weightd-bench/ckpt}
GIB=${WEIGHTD_BENCH_GIB:-8}
mkdir -p "$OUT" "$CKPT"
exec > >(tee -a "$OUT/bench.log") 2>&1
source test/gpu/ensure-node.sh
nvidia-smi -L; nproc
echo "== $(date +%T) checkpoint"
timeout 240 python3 bench/gpu/make-checkpoint.py --out "$CKPT" --gib "$GIB" --shards 4
cat "$CKPT"/*.safetensors > /dev/null
echo "== $(date +%T) hot: 10 alternating blocks of 3 fills, without / with digests"
configs=$(node -p 'JSON.stringify(Array.from({ length: 20 }, (_, i) => (i % 2 ? { digest: true } : {})))')
timeout 300 node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 3 --configs "$configs" --label hot --out "$OUT/fill-digest.jsonl"
echo "== $(date +%T) cold: 3 alternating fills each way (O_DIRECT, 8 MiB chunks, as a cold daemon load)"
cold='[{"direct":true,"chunkBytes":8388608,"stagingBytes":134217728},{"direct":true,"chunkBytes":8388608,"stagingBytes":134217728,"digest":true}]'
for _ in 1 2 3; do
  timeout 60 node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 1 --cold --configs "$cold" --label cold --out "$OUT/fill-digest.jsonl"
done
node --input-type=module -e '
  const fs = await import("node:fs");
  const lines = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => JSON.parse(l));
  const median = (a) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)]; };
  const out = {};
  for (const label of ["hot", "cold"]) {
    const of = (digest) => lines.filter((l) => l.label === label && Boolean(l.results[0].options.digest) === digest)
      .flatMap((l) => l.results[0].runs.map((r) => l.payloadBytes / Math.max(...r.deviceSeconds) / 1e9));
    const [without, withDigest] = [of(false), of(true)];
    out[label] = { fills: [without.length, withDigest.length], medianGBpsWithout: median(without), medianGBpsWith: median(withDigest), ratio: median(withDigest) / median(without) };
  }
  out.target = "ratio >= 0.98";
  fs.writeFileSync(process.argv[2], JSON.stringify(out, null, 1));
  console.log(JSON.stringify(out, null, 1));
' "$OUT/fill-digest.jsonl" "$OUT/summary.json"
