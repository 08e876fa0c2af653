# Session 52's call: (1) issue 29, the fill with GPU digests against without, this addon (the job
# table in one allocation, uploaded synchronously then the legacy stream waited for, 86630e1 + 5a137b4) against main 4e038fa's, 3 rounds;
# (2) issue 33, starts that load and restarts that adopt, this tree (fill polled by time left,
# c785a3e) against 4e038fa, 4 pairs; (3) the pinned host-to-device ceiling in the same call.
export PYTHONUNBUFFERED=1 W=/tmp/w
mkdir -p $W /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node && export PATH=/tmp/nodebin:$PATH
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
[ -d node_modules ] || tar xJf .devrun/nm.tar.xz
rm -rf dist && mkdir -p dist && tar xJf .devrun/dist.tar.xz -C dist
el() { date -u +%T; }
pack() { cp -r $W/. $OUT/ 2>/dev/null; }
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; git log --oneline -1 2>/dev/null
source test/gpu/ensure-kernel.sh > $W/kernel.log 2>&1; tail -2 $W/kernel.log
mkdir -p /tmp/refaddon && tar xJf .devrun/ref-4e038fa.tar.xz -C /tmp/refaddon build/Release/weightd.node
echo "== $(el) fill pair"
timeout 240 bash bench/gpu/fill-digest-pair.sh $W/fill-pair /tmp/refaddon/build/Release/weightd.node 3 2>&1 | tail -10
pack
echo "== $(el) restart pair"
timeout 120 bash bench/gpu/restart-pair.sh $W/restart-pair 3 .devrun/ref-4e038fa.tar.xz 2>&1 | tail -10
pack
echo "== $(el) baselines"
timeout 45 python3 bench/gpu/baselines.py --ckpt /var/tmp/weightd-bench/ckpt --reps 1 > $W/baselines.json 2>$W/baselines.err; cut -c1-400 $W/baselines.json; tail -2 $W/baselines.err
pack
echo "== $(el) done"
