# Sourced first by every device call: node, Python wheels, node_modules, dist, the digest kernel,
# and /tmp/refroot (this tree with 8399fdf's dist, Python client and addon from
# .devrun/ref-8399fdf.tar.xz; the kernel is this build's: its code is the same). W: a work folder.
export PYTHONUNBUFFERED=1 W=/tmp/w
mkdir -p $W /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node && export PATH=/tmp/nodebin:$PATH
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
[ -d node_modules ] || tar xJf .devrun/nm.tar.xz
rm -rf dist && mkdir -p dist && tar xJf .devrun/dist.tar.xz -C dist
source test/gpu/ensure-kernel.sh > $W/kernel.log 2>&1; tail -1 $W/kernel.log


el() { date -u +%T; }
pack() { tar czf $OUT/w.tgz -C $W .; }
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
rm -rf /tmp/refroot && mkdir /tmp/refroot && tar cf - --exclude=./.devrun --exclude=./.device --exclude=./.git --exclude=./node_modules --exclude=./.whl --exclude=./dist --exclude=./bench/results --exclude=./bench/gpu/results . | tar xf - -C /tmp/refroot && tar xJf .devrun/ref-8399fdf.tar.xz -C /tmp/refroot && ln -s $PWD/node_modules /tmp/refroot/node_modules && ls /tmp/refroot/build/Release
