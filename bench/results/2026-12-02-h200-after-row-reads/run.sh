set -uo pipefail
source test/gpu/unpack-bundle.sh >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
nvidia-smi --query-gpu=name,uuid,memory.used,driver_version --format=csv > $W/gpu-before.csv; cat $W/gpu-before.csv
WEIGHTD_SUITE_BUDGET_S=300 timeout 400 bash test/gpu/run.sh --out $W/gpu-check.json --out-dir $W/daemon > $W/suite.log 2>&1; el test:gpu $?
grep -E "passed, [0-9]+ failed|scenario .*: [A-Z]|restart: .*FAILED" $W/suite.log | cut -c1-200; pack
( timeout 60 python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-ckpt --gib 8 --shards 4 > $W/mk8.log 2>&1 ) ; el mk8 $?
timeout 80 node dist/bench/ready.js --model /var/tmp/wb-ckpt --device cuda --runs 3 --out $W/ready-8g > $W/ready-8g.log 2>&1; el ready8g $?; tail -c 700 $W/ready-8g.log; pack
D=$(mktemp -d /tmp/wdfa-XXXX); node dist/main.js --model /var/tmp/wb-ckpt --device cuda --weight-cache-socket-dir $D > $W/fa-daemon.log 2>&1 & DP=$!
for i in $(seq 100); do grep -q READY $W/fa-daemon.log && break; sleep 0.1; done
timeout 60 python3 bench/gpu/first-attach-profile.py $D cuda > $W/first-attach-profile.txt 2>&1; el profile $?; head -c 3500 $W/first-attach-profile.txt
kill -TERM $DP; wait $DP; pack
timeout 100 node dist/bench/restart.js --model /var/tmp/wb-ckpt --device cuda --runs 3 --out $W/restart-8g > $W/restart-8g.log 2>&1; el restart8g $?; tail -c 600 $W/restart-8g.log; pack
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv; pgrep -a weightd-keeper
pack
