# Issue 33: the 8.56 GB start to READY pair again on the same warm H100 (4 more pairs).
source .devrun/prep.sh
(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
echo "== $(el) restart pair"; timeout 200 bash bench/gpu/restart-pair.sh $W/restart-pair 4 /tmp/base.tar.xz 2>&1 | tail -9
pack; echo "== $(el) done"
