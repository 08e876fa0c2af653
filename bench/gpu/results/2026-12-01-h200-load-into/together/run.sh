set -uo pipefail
export PYTHONUNBUFFERED=1
rm -rf /tmp/wb && mkdir -p /tmp/wb && tar xzf .device/weightd.tar.gz -C /tmp/wb
B=$(ls -d /tmp/wb/weightd-*); export PATH=$B/bin:$PATH; ln -sfn $B/node_modules node_modules
# The bundle holds the daemon (dist/src, dist/main.js, the addon); the Python tests start it from dist/.
mkdir -p dist build; ln -sfn $B/dist/src dist/src; cp $B/dist/main.js dist/main.js; ln -sfn $B/build/Release build/Release
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:clients/python
date -u; nvidia-smi -L; node --version; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
T0=$(date +%s)
WEIGHTD_TEST_DEVICE=cuda timeout 400 python3 -m pytest -q -p no:cacheprovider -rs clients/python/tests/test_torch_load_into.py > $OUT/torch-load-into-cuda.log 2>&1; echo "load_into on cuda rc=$? $(( $(date +%s)-T0 ))s"; tail -15 $OUT/torch-load-into-cuda.log
nvidia-smi --query-gpu=memory.used --format=csv
