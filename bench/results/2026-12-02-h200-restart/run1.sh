set -uo pipefail
source test/gpu/unpack-bundle.sh
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
nvidia-smi --query-gpu=name,uuid,memory.used,driver_version --format=csv > $W/gpu-before.csv
WEIGHTD_SUITE_BUDGET_S=300 timeout 420 bash test/gpu/run.sh --out $W/gpu-check.json --out-dir $W/daemon > $W/suite.log 2>&1; el test:gpu $?
grep -E "passed, [0-9]+ failed|restart:|scenario" $W/suite.log | cut -c1-260; pack
timeout 150 node --expose-gc dist/test/client/cudaAttach.test.js > $W/cudaAttach.log 2>&1; el cudaAttach $?; tail -3 $W/cudaAttach.log; pack
timeout 90 node dist/bench/restart.js --model /var/tmp/weightd-gpu-test/ckpt --device cuda --runs 3 --out $W/restart-1g-cuda > $W/restart-1g.log 2>&1; el restart1g $?; tail -c 1500 $W/restart-1g.log; pack
[ -e /var/tmp/wb-ckpt/model.safetensors.index.json ] || timeout 120 python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-ckpt --gib 8 --shards 4 > $W/mk8.log 2>&1; el mk8 $?
timeout 100 node dist/bench/restart.js --model /var/tmp/wb-ckpt --device cuda --runs 3 --out $W/restart-8g-cuda > $W/restart-8g.log 2>&1; el restart8g $?; tail -c 1500 $W/restart-8g.log
timeout 60 node dist/bench/ready.js --model /var/tmp/wb-ckpt --device cuda --runs 2 --out $W/ready-8g-ipc > $W/ready-8g.log 2>&1; el ready8g $?; tail -c 800 $W/ready-8g.log
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv; pgrep -a weightd-keeper; pgrep -af "dist/main.js" | head -3
pack; ls -la $OUT
