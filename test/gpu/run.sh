#!/usr/bin/env bash
# `npm run test:gpu`: the cuda backend's correctness on this machine's GPU(s) (gpu-check.mjs:
# tensor-parallel fills byte-exact in every mode, IPC from Python and from the TypeScript
# client). Needs an NVIDIA GPU, python3 with numpy, build/Release/weightd.node and dist/.
#   bash test/gpu/run.sh [--ckpt DIR] [--out FILE]
# Without --ckpt it writes a 1 GiB random checkpoint under /var/tmp first. The CI-safe part (a
# fake driver, no GPU) is test/gpu/cudaBackendFake.test.ts, run by `npm test`.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source test/gpu/ensure-node.sh
ckpt="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ckpt) ckpt=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: test/gpu/run.sh [--ckpt DIR] [--out FILE]" >&2; exit 2 ;;
  esac
done
if [ -z "$ckpt" ]; then
  ckpt=/var/tmp/weightd-gpu-test/ckpt
  [ -n "$(ls "$ckpt"/*.safetensors 2>/dev/null)" ] || python3 bench/gpu/make-checkpoint.py --out "$ckpt" --gib 1 --shards 2
fi
bytes=$(cat "$ckpt"/*.safetensors | wc -c)
# The expected slices (as large as the checkpoint) go to /dev/shm when it has room for them.
work=/dev/shm/weightd-gpu-check
[ "$(df --output=avail -B1 /dev/shm | tail -1)" -gt $((bytes * 3 / 2)) ] || work=$(dirname "$ckpt")/gpu-check
exec node test/gpu/gpu-check.mjs --ckpt "$ckpt" --work "$work" ${out:+--out "$out"}
