set -uo pipefail
source test/gpu/unpack-bundle.sh >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
pack() { tar czf $OUT/results.tgz -C $OUT w; }
el() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
date -u > $W/date.txt; echo "bundle and dist of main at 0d9b5e6" > $W/commit.txt
nvidia-smi --query-gpu=name,uuid,memory.used,driver_version --format=csv > $W/gpu-before.csv; cat $W/gpu-before.csv
timeout 60 node --expose-gc dist/test/client/cudaAttach.test.js > $W/cudaAttach.log 2>&1; el cudaAttach $?; tail -3 $W/cudaAttach.log
WEIGHTD_SUITE_BUDGET_S=430 timeout 515 bash test/gpu/run.sh --out $W/gpu-check.json --out-dir $W/daemon > $W/suite.log 2>&1; el test:gpu $?
grep -E "passed, [0-9]+ failed|scenario .*: [A-Z]|FAILED" $W/suite.log | cut -c1-220 | tail -40; pack
nvidia-smi --query-gpu=memory.used --format=csv > $W/gpu-after.csv; cat $W/gpu-after.csv; pgrep -a weightd-keeper
pack
