# Issue 33: a cuda start to READY and a restart that adopts (restart-pair.sh), this build (rank
# threads started warm while the node plans) against main 17b7160's, alternating, 4 pairs. On an
# H200 also the fill with GPU digests against without (issue 29).
source .devrun/prep.sh
(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
echo "== $(el) restart pair"; timeout 330 bash bench/gpu/restart-pair.sh $W/restart-pair 4 /tmp/base.tar.xz 2>&1 | tail -9
for f in $W/restart-pair/*/daemon.jsonl; do echo "$f $(grep -h '"which":"loaded"' $f | grep -oE '"sinceStartMs":[0-9]+,[^}]{0,40}"msg":"(control socket|checkpoint planned|single node|rank 0 allocated|rank 0 loaded|READY)' | sed -E 's/"sinceStartMs":([0-9]+).*"msg":"(.*)/\1 \2/' | tr '\n' ';')"; done
if nvidia-smi -L | grep -q H200; then echo "== $(el) H200: fill digest pair (issue 29)"; timeout 150 bash bench/gpu/fill-digest-pair.sh $W/fill-pair /tmp/refroot/build/Release/weightd.node 2 > $W/fill-pair.log 2>&1; tail -3 $W/fill-pair.log; fi
pack; echo "== $(el) done"
