# Sourced by a device run script (bench/*/results/*/run.sh) in a checkout on the GPU machine:
# unpacks the carried bundle (.device/weightd.tar.gz, `npm run bundle`) to /tmp/wb and points
# this checkout's node_modules, dist and build/Release at it, so the tests and benchmarks here
# run the bundled daemon; installs the carried Python wheels (.whl/) to /tmp/site. Exports B
# (the bundle), PATH, PYTHONPATH, WEIGHTD_BIN and WEIGHTD_PYTHON. With .device/devtest.tgz
# (uvu and the other test-only packages) carried too, it adds them, for dist/test files.
export PYTHONUNBUFFERED=1
rm -rf /tmp/wb && mkdir -p /tmp/wb && tar xzf .device/weightd.tar.gz -C /tmp/wb
B=$(ls -d /tmp/wb/weightd-*); export B PATH=$B/bin:$PATH
ln -sfn "$B/node_modules" node_modules
[ -e .device/devtest.tgz ] && tar xzf .device/devtest.tgz -C "$B/node_modules"
mkdir -p dist build; ln -sfn "$B/dist/src" dist/src; cp "$B/dist/main.js" dist/main.js; ln -sfn "$B/build/Release" build/Release
# --find-links: .whl may hold a wheel per Python version; pip takes the one that fits.
python3 -m pip install -q --no-index --find-links .whl --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site xxhash rfc8785
export PYTHONPATH=/tmp/site:clients/python WEIGHTD_BIN=$B/bin/weightd WEIGHTD_PYTHON=python3
date -u; nvidia-smi -L
