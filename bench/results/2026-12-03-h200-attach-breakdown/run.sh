set -uo pipefail
source test/gpu/unpack-bundle.sh >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
date -u > $W/date.txt; uptime >> $W/date.txt; echo "daemon: bundle of main at 3dd0af4; client and bench/attach-breakdown.py of the working tree after 74bfd38" > $W/builds.txt
nvidia-smi --query-gpu=name,uuid,memory.used,driver_version --format=csv > $W/gpu-before.csv; cat $W/gpu-before.csv
timeout 90 python3 bench/gpu/make-checkpoint.py --out /var/tmp/ck50k --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 > $W/mk50k.log 2>&1; el mk50k $?
D=$(mktemp -d /tmp/wdap-XXXX); node dist/main.js --model /var/tmp/ck50k --device cuda --weight-cache-socket-dir $D > $W/daemon-50k.log 2>&1 & DP=$!
for i in $(seq 300); do grep -q READY $W/daemon-50k.log && break; sleep 0.1; done
for i in 1 2 3 4 5 6; do timeout 60 python3 bench/attach-breakdown.py $D cuda >> $W/breakdown-50k.jsonl 2>> $W/breakdown.err; done; el breakdown $?; cat $W/breakdown-50k.jsonl; tail -3 $W/breakdown.err
kill -TERM $DP; wait $DP
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv
pack
