set -uo pipefail
source test/gpu/unpack-bundle.sh >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
date -u > $W/date.txt; nproc > $W/nproc.txt; uptime >> $W/date.txt
echo "after: bundle and dist of main at 0d9b5e6; before: main at 8526fb1 (dist, clients/python)" > $W/builds.txt
rm -rf /tmp/before && mkdir -p /tmp/before/build && cp -r .device/before/dist .device/before/package.json /tmp/before/ && ln -s $B/node_modules /tmp/before/node_modules && ln -s $B/build/Release /tmp/before/build/Release
MK="timeout 90 python3 bench/gpu/make-checkpoint.py"
$MK --out /var/tmp/ck130 --gib 1.3 --hidden 2048 --inter 5632 --kv 512 --vocab 32000 --shards 2 > $W/mk130.log 2>&1; el mk130 $?
$MK --out /var/tmp/ck500 --gib 1.3 --hidden 1024 --inter 2816 --kv 256 --vocab 32000 --shards 2 > $W/mk500.log 2>&1; el mk500 $?
$MK --out /var/tmp/ck50k --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 > $W/mk50k.log 2>&1; el mk50k $?
$MK --out /var/tmp/ck8 --gib 8 --shards 4 > $W/mk8.log 2>&1; el mk8 $?
for m in ck130 ck500 ck8 ck50k; do
  D=$(mktemp -d /tmp/wdap-XXXX); node dist/main.js --model /var/tmp/$m --device cuda --weight-cache-socket-dir $D > $W/ap-daemon-$m.log 2>&1 & DP=$!
  for i in $(seq 300); do grep -q READY $W/ap-daemon-$m.log && break; sleep 0.1; done
  timeout 150 python3 bench/attach-pair.py --socket-dir $D --before .device/before/clients/python --device cuda --runs 6 --out $W/attach-pair-$m.jsonl > $W/attach-pair-$m.txt 2>&1; el attach-$m $?; cat $W/attach-pair-$m.txt
  kill -TERM $DP; wait $DP; pack
done
timeout 120 node dist/bench/startup.js --before /tmp/before/dist/main.js --out $W/startup-50k --model /var/tmp/ck50k --device cuda --runs 5 > $W/startup-50k.log 2>&1; el startup50k $?; tail -c 900 $W/startup-50k.log; pack
timeout 100 node dist/bench/ready.js --model /var/tmp/ck50k --device cuda --runs 3 --out $W/ready-50k > $W/ready-50k.log 2>&1; el ready50k $?; tail -c 700 $W/ready-50k.log; pack
mkdir -p $W/prof-50k; D=$(mktemp -d /tmp/wdap-XXXX); node --cpu-prof --cpu-prof-dir=$W/prof-50k dist/main.js --model /var/tmp/ck50k --device cuda --weight-cache-socket-dir $D > $W/prof-50k/daemon.log 2>&1 & DP=$!
for i in $(seq 300); do grep -q READY $W/prof-50k/daemon.log && break; sleep 0.1; done; kill -INT $DP; wait $DP; el prof $?; pack
left=$(( 560 - ($(date +%s)-T0) )); echo "left $left s"
[ $left -gt 60 ] && { timeout $((left-15)) node dist/bench/startup.js --before /tmp/before/dist/main.js --out $W/startup-8g --model /var/tmp/ck8 --device cuda --runs 6 > $W/startup-8g.log 2>&1; el startup8g $?; tail -c 900 $W/startup-8g.log; }
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv
pack
