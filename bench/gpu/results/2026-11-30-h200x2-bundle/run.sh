#!/usr/bin/env bash
# The GPU suite on the final code, with the daemon shipped as `npm run bundle` makes it.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
rm -rf /tmp/wb && mkdir -p /tmp/wb && tar xzf .device/weightd.tar.gz -C /tmp/wb
B=$(ls -d /tmp/wb/weightd-*)
export PATH=$B/bin:$PATH
ln -sfn $B/node_modules node_modules
which node; node --version; $B/bin/weightd --version
date -u; nvidia-smi -L
export WEIGHTD_BIN=$B/bin/weightd
bash test/gpu/run.sh --out $OUT/gpu-check.json --out-dir /tmp/daemon > /tmp/suite.log 2>&1; echo "test:gpu rc=$?"
grep -E "passed, [0-9]+ failed|^(ok|FAIL) " /tmp/suite.log | cut -c1-200 | tail -30
grep -h -o '"cmd": "[^"]*"' /tmp/daemon/*.json | head -2
cp /tmp/suite.log /tmp/daemon/suite.log
tar czf $OUT/daemon.tgz -C /tmp daemon
