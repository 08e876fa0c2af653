# 86630e1 + 5a137b4 on a GPU: a cuda daemon fills a 1 GiB checkpoint hashing its digests on the GPU (the job
# table uploaded in one allocation from pageable memory, the legacy stream waited for), then weightd verify hashes the files
# on the CPU and compares every tensor with the fill's digests.
mkdir -p /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node && export PATH=/tmp/nodebin:$PATH
[ -d node_modules ] || tar xJf .devrun/nm.tar.xz
rm -rf dist && mkdir -p dist && tar xJf .devrun/dist.tar.xz -C dist
nvidia-smi -L; date -u
source test/gpu/ensure-kernel.sh > $OUT/kernel.log 2>&1; tail -1 $OUT/kernel.log
python3 bench/gpu/make-checkpoint.py --out /var/tmp/ck1 --gib 1 --shards 2 > /dev/null
mkdir -m 700 -p /tmp/s1
timeout 90 node dist/main.js --model /var/tmp/ck1 --device cuda --weight-cache-socket-dir /tmp/s1 > $OUT/daemon.log 2>&1 &
for i in $(seq 200); do grep -q READY $OUT/daemon.log && break; sleep 0.2; done
node dist/main.js verify --model /var/tmp/ck1 --weight-cache-socket-dir /tmp/s1 > $OUT/verify.log 2>&1; echo "verify rc $?"; tail -1 $OUT/verify.log
grep -c "hashed its content digests on the CPU" $OUT/daemon.log; grep -o "loaded [^\"]*" $OUT/daemon.log | head -3
kill %1; wait; date -u
