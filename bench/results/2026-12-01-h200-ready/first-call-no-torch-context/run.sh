set -uo pipefail
export PYTHONUNBUFFERED=1
rm -rf /tmp/wb && mkdir -p /tmp/wb && tar xzf .device/weightd.tar.gz -C /tmp/wb
B=$(ls -d /tmp/wb/weightd-*); export PATH=$B/bin:$PATH; ln -sfn $B/node_modules node_modules
tar xzf .device/devtest.tgz -C $B/node_modules
mkdir -p dist build; ln -sfn $B/dist/src dist/src; cp $B/dist/main.js dist/main.js; ln -sfn $B/build/Release build/Release
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:clients/python
date -u; nvidia-smi -L
export WEIGHTD_BIN=$B/bin/weightd WEIGHTD_PYTHON=python3
T0=$(date +%s)
python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-ckpt --gib 8 --shards 4; echo "checkpoint $(( $(date +%s)-T0 ))s"
T0=$(date +%s)
timeout 200 node dist/bench/ready.js --model /var/tmp/wb-ckpt --device cuda --runs 3 --out $OUT/ready-8gb; echo "ready bench rc=$? $(( $(date +%s)-T0 ))s"
T0=$(date +%s)
bash test/gpu/run.sh --out $OUT/gpu-check.json --out-dir $OUT/daemon > $OUT/suite.log 2>&1; echo "test:gpu rc=$? $(( $(date +%s)-T0 ))s"
grep -E "passed, [0-9]+ failed" $OUT/suite.log
nvidia-smi --query-gpu=memory.used --format=csv
