set -uo pipefail
source test/gpu/unpack-bundle.sh >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
date -u > $W/date.txt; nproc > $W/nproc.txt; uptime >> $W/date.txt
# before: main at 918be10 (dist, package.json, clients/python), on the bundle's node_modules and addon
rm -rf /tmp/before && mkdir -p /tmp/before/build && cp -r .device/before/dist .device/before/package.json /tmp/before/ && ln -s $B/node_modules /tmp/before/node_modules && ln -s $B/build/Release /tmp/before/build/Release
nvidia-smi --query-gpu=name,uuid,memory.used,driver_version --format=csv > $W/gpu-before.csv; cat $W/gpu-before.csv
timeout 60 python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-ckpt --gib 8 --shards 4 > $W/mk8.log 2>&1; el mk8 $?; cat $W/mk8.log
timeout 150 node dist/bench/startup.js --before /tmp/before/dist/main.js --out $W/startup-8g --model /var/tmp/wb-ckpt --device cuda --runs 8 > $W/startup-8g.log 2>&1; el startup8g $?; tail -c 900 $W/startup-8g.log; pack
timeout 90 node dist/bench/ready.js --model /var/tmp/wb-ckpt --device cuda --runs 3 --out $W/ready-8g > $W/ready-8g.log 2>&1; el ready8g $?; tail -c 700 $W/ready-8g.log; pack
timeout 60 python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-50k --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 > $W/mk50k.log 2>&1; el mk50k $?; cat $W/mk50k.log
timeout 120 node dist/bench/ready.js --model /var/tmp/wb-50k --device cuda --runs 3 --out $W/ready-50k > $W/ready-50k.log 2>&1; el ready50k $?; tail -c 700 $W/ready-50k.log; pack
D=$(mktemp -d /tmp/wdap-XXXX); node dist/main.js --model /var/tmp/wb-50k --device cuda --weight-cache-socket-dir $D > $W/ap-daemon-50k.log 2>&1 & DP=$!
for i in $(seq 300); do grep -q READY $W/ap-daemon-50k.log && break; sleep 0.1; done
timeout 120 python3 bench/attach-pair.py --socket-dir $D --before .device/before/clients/python --device cuda --runs 4 --out $W/attach-pair-50k.jsonl > $W/attach-pair-50k.txt 2>&1; el attachpair50k $?; cat $W/attach-pair-50k.txt
kill -TERM $DP; wait $DP; pack
D=$(mktemp -d /tmp/wdap-XXXX); node dist/main.js --model /var/tmp/wb-ckpt --device cuda --weight-cache-socket-dir $D > $W/ap-daemon-8g.log 2>&1 & DP=$!
for i in $(seq 300); do grep -q READY $W/ap-daemon-8g.log && break; sleep 0.1; done
timeout 60 python3 bench/attach-pair.py --socket-dir $D --before .device/before/clients/python --device cuda --runs 4 --out $W/attach-pair-8g.jsonl > $W/attach-pair-8g.txt 2>&1; el attachpair8g $?; cat $W/attach-pair-8g.txt
kill -TERM $DP; wait $DP; pack
rm -rf /var/tmp/wb-50k
left=$(( 540 - ($(date +%s)-T0) )); echo "left $left s"
if [ $left -gt 200 ]; then
  timeout $((left-120)) python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-26g --gib 26 --shards 8 > $W/mk26.log 2>&1; el mk26 $?; cat $W/mk26.log
  left=$(( 560 - ($(date +%s)-T0) ))
  [ $left -gt 40 ] && { timeout $((left-10)) node dist/bench/startup.js --before /tmp/before/dist/main.js --out $W/startup-26g --model /var/tmp/wb-26g --device cuda --runs 3 > $W/startup-26g.log 2>&1; el startup26g $?; tail -c 900 $W/startup-26g.log; }
fi
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv
pack
