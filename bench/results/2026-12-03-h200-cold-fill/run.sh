set -uo pipefail
source test/gpu/unpack-bundle.sh >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
date -u > $W/date.txt; uptime >> $W/date.txt; nproc >> $W/date.txt; df -hT /var/tmp >> $W/date.txt; lsblk -d -o NAME,SIZE,MODEL,ROTA >> $W/date.txt 2>&1
nvidia-smi --query-gpu=name,uuid,memory.used,driver_version --format=csv > $W/gpu-before.csv; cat $W/gpu-before.csv
timeout 60 node --expose-gc dist/test/client/cudaAttach.test.js > $W/cudaAttach.log 2>&1; el cudaAttach $?; tail -4 $W/cudaAttach.log | head -2
WEIGHTD_SUITE_BUDGET_S=200 timeout 230 bash test/gpu/daemon-suite.sh --out-dir $W/daemon --scenarios checkpoint,tp1,models > $W/suite.log 2>&1; el suite $?
grep -E "passed, [0-9]+ failed|scenario .*: [A-Z]|FAILED" $W/suite.log | cut -c1-200 | tail -12; pack
timeout 60 python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-ckpt --gib 8 --shards 4 > $W/mk8.log 2>&1; el mk8 $?; cat $W/mk8.log
timeout 150 node dist/bench/cold.js --model /var/tmp/wb-ckpt --device cuda --runs 3 --probe-threads 8,32 --out $W/cold-8g > $W/cold-8g.log 2>&1; el cold8g $?; tail -c 800 $W/cold-8g.log; pack
cat /var/tmp/wb-ckpt/*.safetensors > /dev/null
timeout 60 python3 bench/gpu/baselines.py --ckpt /var/tmp/wb-ckpt > $W/baselines.json 2>$W/baselines.err; el baselines $?; cat $W/baselines.json | head -c 800; pack
left=$(( 470 - ($(date +%s)-T0) ))
timeout $((left > 20 ? left - 10 : 10)) node dist/bench/ready.js --model /var/tmp/wb-ckpt --device cuda --runs 3 --out $W/ready-8g > $W/ready-8g.log 2>&1; el ready8g $?; grep -o '"msg":"rank 0 loaded[^"]*"' $W/ready-8g/daemon.jsonl
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv
pack
