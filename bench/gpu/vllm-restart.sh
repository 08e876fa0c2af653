#!/usr/bin/env bash
# An engine restart with CUDA graphs on, disk against weightd, on the H200 (bench/gpu/vllm_restart.py
# says what is timed). Device calls: 1 and 2 of test/gpu/vllm/run.sh (stage vLLM 0.26 into
# /tmp/vsite), then, carrying [".device", "dist", "build"], within the machine's warm window:
#   bash bench/gpu/vllm-restart.sh --out-dir $OUT
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out_dir=${OUT:-bench/out/vllm-restart}
[ "${1:-}" = --out-dir ] && out_dir=$2
mkdir -p "$out_dir"
source test/gpu/vllm/stage.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader
timeout 560 python3 bench/gpu/vllm_restart.py all --out "$out_dir" 2>&1 | grep -v '^\(INFO\|WARNING\|DEBUG\)' | tail -40
