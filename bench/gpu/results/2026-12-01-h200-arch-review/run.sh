set -uo pipefail
source test/gpu/unpack-bundle.sh
T0=$(date +%s)
bash test/gpu/run.sh --out $OUT/gpu-check.json --out-dir $OUT/daemon > $OUT/suite.log 2>&1; echo "test:gpu rc=$? $(( $(date +%s)-T0 ))s"
grep -E "passed, [0-9]+ failed" $OUT/suite.log
timeout 200 node --expose-gc dist/test/client/cudaAttach.test.js > $OUT/cudaAttach.log 2>&1; echo "cudaAttach rc=$? $(( $(date +%s)-T0 ))s"; tail -3 $OUT/cudaAttach.log
WEIGHTD_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider clients/python/tests/test_torch_load_into.py > $OUT/torch-load-into-cuda.log 2>&1; echo "load_into cuda rc=$? $(( $(date +%s)-T0 ))s"; tail -2 $OUT/torch-load-into-cuda.log
nvidia-smi --query-gpu=memory.used --format=csv
