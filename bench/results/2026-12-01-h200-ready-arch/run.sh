set -uo pipefail
export PYTHONUNBUFFERED=1
rm -rf /tmp/wb && mkdir -p /tmp/wb && tar xzf .device/weightd.tar.gz -C /tmp/wb
B=$(ls -d /tmp/wb/weightd-*); export PATH=$B/bin:$PATH; ln -sfn $B/node_modules node_modules
mkdir -p dist build; ln -sfn $B/dist/src dist/src; cp $B/dist/main.js dist/main.js; ln -sfn $B/build/Release build/Release
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:clients/python
date -u; nvidia-smi -L; ls bench/gpu | tr "\n" " "; echo
export WEIGHTD_BIN=$B/bin/weightd WEIGHTD_PYTHON=python3
[ -e /var/tmp/wb-ckpt/model.safetensors.index.json ] || python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-ckpt --gib 8 --shards 4
timeout 120 node dist/bench/ready.js --model /var/tmp/wb-ckpt --device cuda --runs 3 --out $OUT/ready-8gb-cuda; echo "8gb cuda rc=$?"
[ -e /var/tmp/wb-ckpt26/model.safetensors.index.json ] || python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-ckpt26 --gib 24.7 --shards 8
timeout 150 node dist/bench/ready.js --model /var/tmp/wb-ckpt26 --device cuda --runs 3 --out $OUT/ready-26gb-cuda; echo "26gb cuda rc=$?"
nvidia-smi --query-gpu=memory.used --format=csv
tar czf $OUT/ready.tgz -C $OUT $(cd $OUT && ls -d ready-*) && rm -rf $OUT/ready-*/
