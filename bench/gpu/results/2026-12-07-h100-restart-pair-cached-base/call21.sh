# Issue 33: the adopting restart again, 5 pairs, f2c108f built with its addon in place (its bundle's
# code cache made, which call20's base lacked) against this tree, 8.56 GB, --keeper spawn.
W=/tmp/w; mkdir -p $W; source .devrun/prep.sh > $W/prep.log 2>&1; tail -3 $W/prep.log
(cd /tmp/refroot && ls -la dist/main.cjs.codecache && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
echo "== $(el) restart pair x5"; timeout 150 bash bench/gpu/restart-pair.sh $W/restart-pair 5 /tmp/base.tar.xz 2>&1 | tail -20; pack
echo "== $(el) done"
