#!/usr/bin/env bash
# weightd end to end on this machine's GPU(s): the daemon (dist/main.js) serves a Llama
# checkpoint written by transformers, and Python clients check every tensor against safetensors
# (tp=1 with a model forward pass, tp=2 on one node, two nodes of one GPU each, restarts with a
# keeper, two models on one daemon and a swap under live clients, a swap across two nodes). See
# test/gpu/daemon_suite.py for the scenarios. Needs NVIDIA GPU(s) (2 for the tp=2 scenarios),
# python3 with torch, safetensors and transformers, build/Release/weightd.node and dist/.
#   bash test/gpu/daemon-suite.sh [--out-dir DIR] [--ckpt DIR] [--device cuda|host] [--small]
#                                 [--scenarios checkpoint,tp1,tp2,two-node,restart,models,models-span] [--budget S]
#                                 [--gpus N] [--swap-clients N]
# Results: DIR/<scenario>.json, DIR/summary.json and DIR/processes.log; DIR defaults
# to $OUT when set (a device call), else test/artifacts/gpu-daemon. Exits non-zero if any
# scenario did not pass. `--device host --small` runs the same orchestration without a GPU.
# WEIGHTD_BIN=DIR/bin/weightd tests the daemon of an unpacked `npm run bundle` instead of dist/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source test/gpu/ensure-node.sh
for f in dist/main.js build/Release/weightd.node; do
  [ -f "$f" ] || { echo "daemon-suite: $f is missing: run npm run build" >&2; exit 1; }
done
# Leave NVLink multicast off on multi-GPU hosts (shared/docs/gpu.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
have_out=0
for a in "$@"; do [ "$a" = --out-dir ] && have_out=1; done
if [ "$have_out" = 0 ]; then
  set -- --out-dir "${OUT:-$root/test/artifacts/gpu-daemon}" "$@"
fi
exec "${PYTHON:-python3}" test/gpu/daemon_suite.py run "$@"
