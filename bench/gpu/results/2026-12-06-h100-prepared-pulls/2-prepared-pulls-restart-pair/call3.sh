# Issue 31 then 33, one call: the 8.24 GB pull update, main 847424c's build ("ref") then this one
# twice; then a cuda start to READY and a restart that adopts (restart-pair.sh), this build (staging
# pinned by the CUDA warm-up) against 847424c's, alternating. Each update run's 16 GB of
# checkpoints is removed after it (the disk holds 64 GB).
source .devrun/prep.sh
U="--layers 20 --hidden 4096 --pull-reps 5"
run() {
  echo "== $(el) $1"; (cd $2 && PYTHONPATH=$2/clients/python:/tmp/site timeout 200 python3 test/gpu/update_cuda.py --out-dir $W/$1 $U > $W/$1.log 2>&1; echo "rc $?" >> $W/$1.log); tail -1 $W/$1.log
  rm -rf /var/tmp/weightd-update-cuda-*
  python3 -c "import json,statistics as s;r=json.load(open('$W/$1/update-cuda.json'));print({k:(round(r[k]['updateSecondsMedian']*1e3,1),round(r[k].get('fromWeightsSecondsMedian',0)*1e3,1),r[k]['preparedSwitchMsMedian']) for k in ('pull','pullFlat','pullFlatPrepared','pullFlatAhead') if k in r})"
}
run u8g-ref /tmp/refroot
run u8g-new $PWD

(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
echo "== $(el) restart pair"; timeout 240 bash bench/gpu/restart-pair.sh $W/restart-pair 3 /tmp/base.tar.xz 2>&1 | tail -9
grep -h "fill's staging" $W/restart-pair/*/daemon.jsonl 2>/dev/null | head -4 | cut -c1-250
if nvidia-smi -L | grep -q H200; then echo "== $(el) H200: fill digest pair (issue 29)"; timeout 150 bash bench/gpu/fill-digest-pair.sh $W/fill-pair /tmp/refroot/build/Release/weightd.node 2 > $W/fill-pair.log 2>&1; tail -3 $W/fill-pair.log; fi
pack; echo "== $(el) done"; df -h /var/tmp | tail -1
