# Sourced from the checkout's root on the GPU machine by test/gpu/vllm/run.sh and
# bench/gpu/vllm-restart.sh: the staged vLLM (/tmp/vsite, device calls 1 and 2 of run.sh), the
# carried daemon (node from .device/node.xz, the runtime node_modules from .device/nm,
# scripts/prune-node-modules.mjs; dist and build as carried) and the client installed so that
# its vLLM entry point is registered.
test -d /tmp/vsite/vllm || { echo "no vLLM in /tmp/vsite: run device calls 1 and 2 first (see the top of test/gpu/vllm/run.sh)" >&2; exit 3; }
source test/gpu/ensure-node.sh
if [ ! -e node_modules ] && [ -d .device/nm ]; then ln -sfn .device/nm node_modules; fi
export NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/site2 clients/python
export PYTHONPATH=/tmp/site2:/tmp/vsite:${PYTHONPATH:-} VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export WEIGHTD_TEST_DEVICE=cuda
