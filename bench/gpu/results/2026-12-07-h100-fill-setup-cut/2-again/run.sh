# Session 52's second call on the warm machine: the first call's restart pair fetched (one tar), then
# 3 more rounds of the fill pair and 4 more restart pairs, the same builds.
export PYTHONUNBUFFERED=1 W=/tmp/w
export PATH=/tmp/nodebin:$PATH PYTHONPATH=/tmp/site
[ -d node_modules ] || tar xJf .devrun/nm.tar.xz
rm -rf dist && mkdir -p dist && tar xJf .devrun/dist.tar.xz -C dist
tar czf $OUT/first-restart-pair.tgz -C $W restart-pair
el() { date -u +%T; }
nvidia-smi -L; date -u
echo "== $(el) fill pair 2"
timeout 150 bash bench/gpu/fill-digest-pair.sh $W/fill-pair-2 /tmp/refaddon/build/Release/weightd.node 3 2>&1 | tail -6
cp -r $W/fill-pair-2 $OUT/
echo "== $(el) restart pair 2"
timeout 90 bash bench/gpu/restart-pair.sh $W/restart-pair-2 4 .devrun/ref-4e038fa.tar.xz 2>&1 | tail -8
tar czf $OUT/second-restart-pair.tgz -C $W restart-pair-2
echo "== $(el) done"
