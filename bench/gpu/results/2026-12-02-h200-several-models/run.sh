set -uo pipefail
source test/gpu/unpack-bundle.sh >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
nvidia-smi --query-gpu=name,uuid,memory.used,driver_version --format=csv > $W/gpu-before.csv; cat $W/gpu-before.csv
WEIGHTD_SUITE_BUDGET_S=300 timeout 400 bash test/gpu/run.sh --out $W/gpu-check.json --out-dir $W/daemon > $W/suite.log 2>&1; el test:gpu $?
grep -E "passed, [0-9]+ failed|scenario .*: [A-Z]|restart: .*FAILED" $W/suite.log | cut -c1-200; pack
timeout 150 node --expose-gc dist/test/client/cudaAttach.test.js > $W/cudaAttach.log 2>&1; el cudaAttach $?; tail -4 $W/cudaAttach.log; pack
D=$(mktemp -d /tmp/wdfa-XXXX); node dist/main.js --model /var/tmp/weightd-daemon-suite/ckpt --device cuda --weight-cache-socket-dir $D > $W/fa-daemon.log 2>&1 & DP=$!
for i in $(seq 100); do grep -q READY $W/fa-daemon.log && break; sleep 0.1; done
for i in 1 2 3; do timeout 60 python3 bench/gpu/first-attach-profile.py $D cuda > $W/first-attach-profile-$i.txt 2>&1; head -1 $W/first-attach-profile-$i.txt; done
kill -TERM $DP; wait $DP; el profile $?
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv; pgrep -a weightd-keeper
pack
