#!/usr/bin/env bash
# `npm run test:gpu:vllm`: the vLLM plugin in a real CUDA vLLM 0.26 (opt-in; needs the payload of
# ../shared/vllm-gpu, staged in /tmp/vsite). Four (six with the follow cases) device calls on `nvidia-h200`, each within 30 s
# of the last (the machine's warm window), each under 10 minutes:
#
#   here:   bash ../shared/vllm-gpu/make-vllm-payload.sh .vllm        # once; .vllm/ is git-excluded
#           bash ../shared/device/pack-node.sh && npm run build && node scripts/prune-node-modules.mjs
#   call 1  carry [".vllm/core"]:
#           rm -rf /tmp/vsite; bash .vllm/core/device-unpack.sh .vllm/core
#   call 2  carry [".vllm/moe"]:
#           test -d /tmp/vsite/vllm || exit 3; bash .vllm/core/device-unpack.sh .vllm/moe
#   call 3  carry [".device", "dist", "build"]:
#           test -d /tmp/vsite/vllm || exit 3; bash test/gpu/vllm/run.sh --out-dir $OUT --models llama,moe,fallbacks
#   call 4  carry [".device", "dist", "build"]:
#           test -d /tmp/vsite/vllm || exit 3; bash test/gpu/vllm/run.sh --out-dir $OUT --models fp8-block,fp8-block-hd64,fp8-tensor
#   call 5  carry [".device", "dist", "build"] (issue 31, engines following a new version):
#           test -d /tmp/vsite/vllm || exit 3; bash test/gpu/vllm/run.sh --out-dir $OUT --models follow,follow-fp8-tensor
#   call 6  as call 5, --models follow-graphs (CUDA graph capture is slow: a call of its own)
#   call 7  as call 5, --models follow-trainer (a trainer writes the version through trainer_send_weights;
#           skipped while the daemon refuses cuda writers, E_UPDATE_UNSUPPORTED)
#   call 8  as call 5, --models fp8-tensor-published (issue 30 §2: the first start publishes what
#           per-tensor FP8's processing computed, the next two map it; the restart time saved)
#
# Calls 3 and 4 each run the carried daemon (node from .device/node.xz, .device/nm as
# node_modules), install the client so that its vLLM entry point is registered, and runs vllm_engine_suite.py: dense and MoE models and
# the FP8 forms, disk against weightd in map and copy mode, the fallbacks, the daemon's memory
# digest before and after, a second restart, and a write into a mapped weight. Results:
# OUT/vllm-suite.json and OUT/vllm-suite.log (the lead records them in test/gpu/RESULTS.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
out_dir=${OUT:-test/artifacts/gpu-vllm} models=llama,moe,fallbacks,fp8-block,fp8-block-hd64,fp8-tensor
while [ $# -gt 0 ]; do
  case "$1" in
    --out-dir) out_dir=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    *) echo "usage: test/gpu/vllm/run.sh [--out-dir DIR] [--models NAME,...]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out_dir"
source test/gpu/vllm/stage.sh
timeout 540 python3 test/gpu/vllm/vllm_engine_suite.py --out "$out_dir/vllm-suite.json" --models "$models" 2>&1 | tee "$out_dir/vllm-suite.log"
