#!/usr/bin/env bash
# The whole GPU benchmark of the cuda backend in one go, for one call on a GPU host (no Node.js
# there: it unpacks .device/node.xz, see shared/docs/gpu.md). Run from the repository root with
# build/Release/weightd.node and dist/ already built. Writes to $OUT (default bench/out):
#   bench.log       everything printed
#   env.json        machine, driver, cudaProbe(), checkpoint
#   baselines.json  pinned host-to-device ceiling, safetensors load_file (hot)
#   cold.json       cold sequential read (cat) and O_DIRECT dd of the same files
#   fills.jsonl     one line per fill-bench run (hot sweep, cold, 1 vs 2 GPUs)
#   gpu-check.json  correctness checks (test/gpu/gpu-check.mjs)
#   summary.json    the figures as ratios against this run's baselines, with the targets
# Environment: WEIGHTD_BENCH_CKPT (checkpoint dir, on a real disk), WEIGHTD_BENCH_GIB (8),
# WEIGHTD_BENCH_SHAPE (extra make-checkpoint.py flags, e.g. smaller --hidden for a quick run).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/bench/out}
CKPT=${WEIGHTD_BENCH_CKPT:-/var/tmp/weightd-bench/ckpt}
GIB=${WEIGHTD_BENCH_GIB:-8}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/bench.log") 2>&1
# Leave NVLink multicast off on multi-GPU hosts (shared/docs/gpu.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
step() { echo "== $(date +%T) $*"; }
# Every step gets at most its own limit and never more than what is left of the whole budget
# (WEIGHTD_BENCH_BUDGET_S, default 540 s: a device call is cut at 600 s), so a slow disk cuts the
# last steps short instead of losing the whole run. Steps are ordered by what matters most.
deadline=$((SECONDS + ${WEIGHTD_BENCH_BUDGET_S:-540}))
limit() { local left=$((deadline - SECONDS)); if [ "$left" -lt "$1" ]; then echo $((left > 1 ? left : 1)); else echo "$1"; fi; }
drop_caches() { sync && echo 3 > /proc/sys/vm/drop_caches; }
seconds() { date +%s.%N; }
gbps() { node -p "($1 / ($3 - $2) / 1e9).toFixed(3)"; }

source test/gpu/ensure-node.sh

step "machine"
nvidia-smi -L; nvidia-smi topo -m 2>/dev/null | head -5; nproc; free -g | head -2; uname -r; node --version
mkdir -p "$CKPT"; df -hT "$CKPT"
gpus=$(node --input-type=module -e 'const { cudaProbe } = await import("./dist/src/native/cuda.js"); console.log((await cudaProbe()).devices.length)')

step "checkpoint: ${GIB} GiB of random bf16 in $CKPT"
# shellcheck disable=SC2086 # WEIGHTD_BENCH_SHAPE is a list of flags
checkpoint=$(timeout "$(limit 240)" python3 bench/gpu/make-checkpoint.py --out "$CKPT" --gib "$GIB" --shards 4 ${WEIGHTD_BENCH_SHAPE:-})
echo "$checkpoint"
bytes=$(cat "$CKPT"/*.safetensors | wc -c)
node --input-type=module -e '
  const { cudaProbe } = await import("./dist/src/native/cuda.js");
  const [checkpoint, gpus, fs] = [JSON.parse(process.argv[1]), Number(process.argv[2]), await import("node:fs")];
  fs.writeFileSync(process.argv[3], JSON.stringify({ date: new Date().toISOString(), gpus, node: process.version, probe: await cudaProbe(), checkpoint }, null, 1));
' "$checkpoint" "$gpus" "$OUT/env.json"
cat "$OUT/env.json"

step "baselines (hot page cache)"
cat "$CKPT"/*.safetensors > /dev/null
timeout "$(limit 240)" python3 bench/gpu/baselines.py --ckpt "$CKPT" | tee "$OUT/baselines.json"

step "hot fills, one GPU: chunk size, staging, threads; register mode for reference"
MiB=1048576
pread() { echo "{\"mode\":\"pread\",\"threads\":$1,\"chunkBytes\":$(($2 * MiB)),\"stagingBytes\":$(($3 * MiB))}"; }
# {} is the default (8 threads, 2 MiB chunks, 32 MiB staging). docs/gpu-results.md has a wider
# sweep; these are its neighbours, to see that the default is still the best here.
configs="[{},$(pread 8 4 64),$(pread 8 8 128),$(pread 6 2 24),$(pread 12 2 48),
  {\"mode\":\"register\",\"chunkBytes\":$((64 * MiB)),\"stagingBytes\":$((1024 * MiB))}]"
timeout "$(limit 240)" node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 3 --label hot-1gpu --configs "$configs" --out "$OUT/fills.jsonl" > /dev/null

if [ "$gpus" -ge 2 ]; then
  # {} gives each GPU its own engine; {"group":true} fills them as one group, one pass over the
  # files (what the daemon does on a node with several GPUs). Replicas: each GPU the whole
  # checkpoint; tp=2: each GPU its rank; disjoint: each GPU half of the files.
  two='[{},{"group":true}]'
  step "two GPUs at once vs one, hot"
  timeout "$(limit 120)" node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 3 --label hot-1gpu-same-config --configs '[{}]' --out "$OUT/fills.jsonl" > /dev/null
  timeout "$(limit 120)" node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0,1 --reps 3 --label hot-2gpu-replicas --configs "$two" --out "$OUT/fills.jsonl" > /dev/null
  timeout "$(limit 120)" node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0,1 --tp 2 --reps 3 --label hot-2gpu-tp2 --configs "$two" --out "$OUT/fills.jsonl" > /dev/null
  timeout "$(limit 120)" node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0,1 --disjoint --reps 3 --label hot-2gpu-disjoint --configs "$two" --out "$OUT/fills.jsonl" > /dev/null
  timeout "$(limit 60)" node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 3 --label hot-1gpu-again --configs '[{}]' --out "$OUT/fills.jsonl" > /dev/null
fi

step "peak host RSS with the default options, each in its own process"
timeout "$(limit 60)" node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 1 --label rss-1gpu --out "$OUT/fills.jsonl" > /dev/null
[ "$gpus" -ge 2 ] && timeout "$(limit 60)" node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0,1 --reps 1 --label rss-2gpu --configs '[{"group":true}]' --out "$OUT/fills.jsonl" > /dev/null

step "correctness on the GPU(s)"
timeout "$(limit 300)" bash test/gpu/run.sh --only check --ckpt "$CKPT" --out "$OUT/gpu-check.json"

step "cold: sequential read of the same files, then fills, page cache dropped before each"
if drop_caches; then
  t0=$(seconds); timeout "$(limit 120)" cat "$CKPT"/*.safetensors > /dev/null; t1=$(seconds)
  cat_gbps=$(gbps "$bytes" "$t0" "$t1")
  drop_caches
  t0=$(seconds); for f in "$CKPT"/*.safetensors; do timeout "$(limit 60)" dd if="$f" of=/dev/null bs=16M iflag=direct status=none; done; t1=$(seconds)
  dd_gbps=$(gbps "$bytes" "$t0" "$t1")
  echo "{\"bytes\":$bytes,\"catGBps\":$cat_gbps,\"ddDirectGBps\":$dd_gbps}" | tee "$OUT/cold.json"
else
  echo "cannot drop the page cache here: no cold figures"
fi
timeout "$(limit 240)" node bench/gpu/fill-bench.mjs --ckpt "$CKPT" --devices 0 --reps 1 --cold --label cold-1gpu --out "$OUT/fills.jsonl" \
  --configs "[{},{\"direct\":true},$(pread 8 8 128 | sed 's/}$/,"direct":true}/'),$(pread 16 2 64 | sed 's/}$/,"direct":true}/')]" > /dev/null

step "summary"
node bench/gpu/summarize.mjs "$OUT" | tee "$OUT/summary.json"
