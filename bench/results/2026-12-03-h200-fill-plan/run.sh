set -uo pipefail
source test/gpu/unpack-bundle.sh >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
date -u > $W/date.txt; nproc > $W/nproc.txt; uptime >> $W/date.txt
echo "after: bundle and dist of main at 3dd0af4; before: main at 8526fb1 (dist, clients/python)" > $W/builds.txt
nvidia-smi --query-gpu=name,uuid,memory.used,driver_version --format=csv > $W/gpu-before.csv; cat $W/gpu-before.csv
rm -rf /tmp/before && mkdir -p /tmp/before/build && cp -r .device/before/dist .device/before/package.json /tmp/before/ && ln -s $B/node_modules /tmp/before/node_modules && ln -s $B/build/Release /tmp/before/build/Release
MK="timeout 90 python3 bench/gpu/make-checkpoint.py"
$MK --out /var/tmp/ck50k --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 > $W/mk50k.log 2>&1; el mk50k $?
$MK --out /var/tmp/ck8 --gib 8 --shards 4 > $W/mk8.log 2>&1; el mk8 $?
timeout 130 node dist/bench/startup.js --before /tmp/before/dist/main.js --out $W/startup-50k --model /var/tmp/ck50k --device cuda --runs 6 > $W/startup-50k.log 2>&1; el startup50k $?; tail -c 900 $W/startup-50k.log; pack
timeout 100 node dist/bench/ready.js --model /var/tmp/ck50k --device cuda --runs 3 --out $W/ready-50k > $W/ready-50k.log 2>&1; el ready50k $?; tail -c 500 $W/ready-50k.log; pack
timeout 120 node dist/bench/startup.js --before /tmp/before/dist/main.js --out $W/startup-8g --model /var/tmp/ck8 --device cuda --runs 8 > $W/startup-8g.log 2>&1; el startup8g $?; tail -c 900 $W/startup-8g.log; pack
timeout 90 node dist/bench/ready.js --model /var/tmp/ck8 --device cuda --runs 3 --out $W/ready-8g > $W/ready-8g.log 2>&1; el ready8g $?; tail -c 500 $W/ready-8g.log; pack
left=$(( 560 - ($(date +%s)-T0) )); echo "left $left s"
if [ $left -gt 230 ]; then
  rm -rf /var/tmp/ck50k
  timeout $((left-120)) python3 bench/gpu/make-checkpoint.py --out /var/tmp/ck26 --gib 26 --shards 8 > $W/mk26.log 2>&1; el mk26 $?
  left=$(( 565 - ($(date +%s)-T0) ))
  [ $left -gt 40 ] && { timeout $((left-10)) node dist/bench/startup.js --before /tmp/before/dist/main.js --out $W/startup-26g --model /var/tmp/ck26 --device cuda --runs 3 > $W/startup-26g.log 2>&1; el startup26g $?; tail -c 900 $W/startup-26g.log; }
fi
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv
pack
