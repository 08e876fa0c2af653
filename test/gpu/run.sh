#!/usr/bin/env bash
# `npm run test:gpu`: weightd on this machine's GPU(s), in two parts, both run (one failing
# does not skip the other); exits non-zero if either fails:
#   check   the cuda backend's correctness (gpu-check.mjs: tensor-parallel fills byte-exact in
#           every mode, IPC from Python and from the TypeScript client, and --cuda-handles fd:
#           VMM descriptors mapped from both and adopted by another process, timed against IPC;
#           the fill's digests hashed on the GPU equal to those hashed on the CPU, on an 8 GiB
#           checkpoint);
#   daemon  the daemon end to end (daemon-suite.sh: a transformers Llama checkpoint served at
#           tp=1, tp=2 and over two nodes, every tensor checked from Python, logits compared;
#           restarts with a keeper; two models on one daemon and a swap under live clients);
#   switch  Attached.switch_to under a captured CUDA graph (switch_graph.py: two versions of a
#           Llama, the same graph replayed gives each one's logits, switch time);
#   update  a writer on the GPU (update_cuda.py: a full and a one-layer update of a ~1 GB Llama
#           written device to device, then full updates pulled from the trainer's own tensors,
#           followed under a captured graph; begin, write or pull, commit and switch times against
#           torch's device-to-device copy, and issue 31's target). WEIGHTD_UPDATE_ARGS passes it
#           more arguments: "--layers 20 --hidden 4096" for the 8 GB model.
# Needs an NVIDIA GPU, python3 with numpy (check) and torch, safetensors, transformers (daemon),
# build/Release/weightd.node and dist/.
#   bash test/gpu/run.sh [--only check|daemon|switch|update] [--ckpt DIR] [--out FILE] [--out-dir DIR]
# The GPU digest kernel is built here first (ensure-kernel.sh: this machine's nvcc, for its GPU).
# --ckpt: the check's checkpoint (without it, a 1 GiB random one under /var/tmp; the digest
# check's is WEIGHTD_DIGEST_CKPT, default the 8 GiB one bench/gpu/fill-digest.sh uses); the daemon
# suite writes its own Llama checkpoint. --out: the check's JSON; --out-dir: the daemon suite's
# results (default $OUT, else test/artifacts/gpu-daemon). The CI-safe part (a fake driver, no
# GPU) is test/gpu/cudaBackendFake.test.ts, run by `npm test`.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source test/gpu/ensure-node.sh
source test/gpu/ensure-kernel.sh
ckpt="" out="" out_dir="" only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ckpt) ckpt=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --out-dir) out_dir=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: test/gpu/run.sh [--only check|daemon|switch|update] [--ckpt DIR] [--out FILE] [--out-dir DIR]" >&2; exit 2 ;;
  esac
done
case "$only" in ""|check|daemon|switch|update) ;; *) echo "--only check|daemon|switch|update" >&2; exit 2 ;; esac

run_check() {
  if [ -z "$ckpt" ]; then
    ckpt=/var/tmp/weightd-gpu-test/ckpt
    [ -n "$(ls "$ckpt"/*.safetensors 2>/dev/null)" ] || python3 bench/gpu/make-checkpoint.py --out "$ckpt" --gib 1 --shards 2
  fi
  local bytes work
  bytes=$(cat "$ckpt"/*.safetensors | wc -c)
  # The expected slices (as large as the checkpoint) go to /dev/shm when it has room for them.
  work=/dev/shm/weightd-gpu-check
  [ "$(df --output=avail -B1 /dev/shm | tail -1)" -gt $((bytes * 3 / 2)) ] || work=$(dirname "$ckpt")/gpu-check
  local digest_ckpt=${WEIGHTD_DIGEST_CKPT:-/var/tmp/weightd-bench/ckpt}
  [ -n "$(ls "$digest_ckpt"/*.safetensors 2>/dev/null)" ] || python3 bench/gpu/make-checkpoint.py --out "$digest_ckpt" --gib 8 --shards 4
  node test/gpu/gpu-check.mjs --ckpt "$ckpt" --digest-ckpt "$digest_ckpt" --work "$work" ${out:+--out "$out"}
}

status=0
if [ -z "$only" ] || [ "$only" = check ]; then
  echo "== gpu-check (cuda backend)"
  run_check || status=1
fi
if [ -z "$only" ] || [ "$only" = daemon ]; then
  echo "== daemon suite (end to end)"
  bash test/gpu/daemon-suite.sh ${out_dir:+--out-dir "$out_dir"} || status=1
fi
if [ -z "$only" ] || [ "$only" = switch ]; then
  echo "== switch_to under a CUDA graph"
  PYTHONPATH="$root/clients/python${PYTHONPATH:+:$PYTHONPATH}" python3 test/gpu/switch_graph.py --out-dir "${out_dir:-${OUT:-test/artifacts/gpu-daemon}}/switch" || status=1
fi
if [ -z "$only" ] || [ "$only" = update ]; then
  echo "== a writer on the GPU, followed under a CUDA graph"
  PYTHONPATH="$root/clients/python${PYTHONPATH:+:$PYTHONPATH}" python3 test/gpu/update_cuda.py --out-dir "${out_dir:-${OUT:-test/artifacts/gpu-daemon}}/update" ${WEIGHTD_UPDATE_ARGS:-} || status=1
fi
exit $status
