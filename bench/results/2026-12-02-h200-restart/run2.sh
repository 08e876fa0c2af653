set -uo pipefail
source test/gpu/unpack-bundle.sh >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
nvidia-smi --query-gpu=name,uuid,memory.used --format=csv > $W/gpu-before.csv; cat $W/gpu-before.csv
timeout 200 python3 bench/gpu/make-checkpoint.py --out /var/tmp/wb-ckpt26 --gib 26 --shards 12 > $W/mk26.log 2>&1; el mk26 $?
timeout 150 node dist/bench/restart.js --model /var/tmp/wb-ckpt26 --device cuda --runs 3 --out $W/restart-26g-cuda > $W/restart-26g.log 2>&1; el restart26g $?; tail -c 1200 $W/restart-26g.log; pack
timeout 120 node dist/bench/ready.js --model /var/tmp/wb-ckpt26 --device cuda --runs 1 --out $W/ready-26g-ipc > $W/ready-26g.log 2>&1; el ready26g $?; tail -c 900 $W/ready-26g.log
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv; pgrep -a weightd-keeper
pack
