# Issue 33: a cuda restart that adopts, 8.56 GB, --keeper spawn, 4 pairs: f2c108f (base: its dist,
# launcher, addon) against this tree (e9d1255: the node's whole status built only on a change of
# its state, not on every supervisor snapshot; 60614ca: the daemon's own /proc identity read once
# for the node manifest, the drain of older versions after a commit's reply).
W=/tmp/w; mkdir -p $W; source .devrun/prep.sh > $W/prep.log 2>&1; tail -3 $W/prep.log
(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
echo "== $(el) restart pair x4"; timeout 200 bash bench/gpu/restart-pair.sh $W/restart-pair 4 /tmp/base.tar.xz 2>&1 | tail -20; pack
echo "== $(el) done"
