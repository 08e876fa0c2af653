#!/usr/bin/env bash
# `npm run test:gpu:vllm`: the vLLM plugin in a real CUDA vLLM 0.26 (opt-in; needs the payload of
# ../shared/vllm-gpu, staged in /tmp/vsite). Three device calls, each within 30 s of the last
# (the machine's warm window), each under 10 minutes:
#
#   here:   bash ../shared/vllm-gpu/make-vllm-payload.sh .vllm        # once; .vllm/ is git-excluded
#           bash ../shared/device/pack-node.sh && npm run build && node scripts/prune-node-modules.mjs
#   call 1  carry [".vllm/core"]:
#           rm -rf /tmp/vsite; bash .vllm/core/device-unpack.sh .vllm/core
#   call 2  carry [".vllm/moe"]:
#           test -d /tmp/vsite/vllm || exit 3; bash .vllm/core/device-unpack.sh .vllm/moe
#   call 3  carry [".device", "dist", "build"]:
#           test -d /tmp/vsite/vllm || exit 3; bash test/gpu/vllm/run.sh --out-dir $OUT
#
# Call 3 unpacks the weightd bundle (test/gpu/unpack-bundle.sh), installs the client so that
# its vLLM entry point is registered, and runs vllm_engine_suite.py: dense and MoE models and
# the FP8 forms, disk against weightd in map and copy mode, the fallbacks, the daemon's memory
# digest before and after, a second restart, and a write into a mapped weight. Results:
# OUT/vllm-suite.json and OUT/vllm-suite.log (the lead records them in test/gpu/RESULTS.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
out_dir=${OUT:-test/artifacts/gpu-vllm}
while [ $# -gt 0 ]; do
  case "$1" in
    --out-dir) out_dir=$2; shift 2 ;;
    *) echo "usage: test/gpu/vllm/run.sh [--out-dir DIR]" >&2; exit 2 ;;
  esac
done
test -d /tmp/vsite/vllm || { echo "no vLLM in /tmp/vsite: run device calls 1 and 2 first (see the top of this script)" >&2; exit 3; }
mkdir -p "$out_dir"
if [ -e .device/weightd.tar.gz ]; then source test/gpu/unpack-bundle.sh; fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/site2 clients/python
export PYTHONPATH=/tmp/site2:/tmp/vsite:${PYTHONPATH:-} VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export WEIGHTD_TEST_DEVICE=cuda
timeout 560 python3 test/gpu/vllm/vllm_engine_suite.py --out "$out_dir/vllm-suite.json" 2>&1 | tee "$out_dir/vllm-suite.log"
