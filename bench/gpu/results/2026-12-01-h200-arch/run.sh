set -uo pipefail
export PYTHONUNBUFFERED=1
rm -rf /tmp/wb && mkdir -p /tmp/wb && tar xzf .device/weightd.tar.gz -C /tmp/wb
B=$(ls -d /tmp/wb/weightd-*); export PATH=$B/bin:$PATH; ln -sfn $B/node_modules node_modules
tar xzf .device/devtest.tgz -C $B/node_modules
# The bundle holds the daemon (dist/src, dist/main.js, the addon); the tests start it from dist/.
mkdir -p dist build; ln -sfn $B/dist/src dist/src; cp $B/dist/main.js dist/main.js; ln -sfn $B/build/Release build/Release
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:clients/python
date -u; nvidia-smi -L; git log --oneline -1 2>/dev/null
export WEIGHTD_BIN=$B/bin/weightd WEIGHTD_PYTHON=python3
T0=$(date +%s)
bash test/gpu/run.sh --out $OUT/gpu-check.json --out-dir $OUT/daemon > $OUT/suite.log 2>&1; echo "test:gpu rc=$? $(( $(date +%s)-T0 ))s"
grep -E "passed, [0-9]+ failed|FAIL|not ok" $OUT/suite.log | head
timeout 200 node --expose-gc dist/test/client/cudaAttach.test.js > $OUT/cudaAttach.log 2>&1; echo "cudaAttach rc=$? $(( $(date +%s)-T0 ))s"; tail -3 $OUT/cudaAttach.log
WEIGHTD_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider clients/python/tests/test_torch_load_into.py > $OUT/torch-load-into-cuda.log 2>&1; echo "load_into cuda rc=$? $(( $(date +%s)-T0 ))s"; tail -2 $OUT/torch-load-into-cuda.log
nvidia-smi --query-gpu=memory.used --format=csv
