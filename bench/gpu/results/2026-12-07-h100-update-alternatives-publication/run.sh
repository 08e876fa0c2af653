# Issue 31: the digest kernel's variants against cudaMemcpy (bench/gpu/digest-copy-probe.cu); then
# update_cuda.py (with the pinned-host, load_state_dict and disk-reload rounds) on 80481bd (ref)
# and this build (new: node.json off the commit's reply, the rank machine provided once, a
# name's status alone, one kernel launch once no final is left to make), alternating.
source .devrun/prep.sh > /tmp/prep.log 2>&1; tail -4 /tmp/prep.log
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
echo "== $(el) probe build sm_$arch"
for v in 4:128 8:128 2:128 4:256; do g=${v%%:*}; t=${v#*:}
  (timeout 200 nvcc -O3 -std=c++17 -arch=sm_$arch -DWEIGHTD_DIGEST_GROUP=$g -DWEIGHTD_DIGEST_BLOCK_THREADS=$t -o /tmp/probe-$g-$t bench/gpu/digest-copy-probe.cu > $W/probe-build-$g-$t.log 2>&1) &
done; wait
for v in 4:128 8:128 2:128 4:256; do g=${v%%:*}; t=${v#*:}
  [ -x /tmp/probe-$g-$t ] && timeout 60 /tmp/probe-$g-$t --gib 8 --reps 7 --batch-gib 1 >> $W/probe.jsonl 2>> $W/probe.err
done; cat $W/probe.jsonl; tail -3 $W/probe.err $W/probe-build-4-128.log; pack
U="--layers 20 --hidden 4096 --pull-reps 3"
for which in new:$PWD ref:/tmp/refroot new2:$PWD ref2:/tmp/refroot; do
  name=u8g-${which%%:*}; root=${which#*:}
  case $name in *2|*ref) [ $SECONDS -lt 300 ] || { echo "== $(el) $name skipped (time)"; continue; } ;; esac
  echo "== $(el) $name"; (cd $root && PYTHONPATH=$root/clients/python:/tmp/site timeout 200 python3 test/gpu/update_cuda.py --out-dir $W/$name $U > $W/$name.log 2>&1; echo "rc $?" >> $W/$name.log); tail -1 $W/$name.log
  rm -rf /var/tmp/weightd-update-cuda-*
  python3 -c "
import json, statistics as st
r=json.load(open('$W/$name/update-cuda.json'))
ks=[k for k in ('pullFlatAhead','pullPlanFlatAhead','pullPlanAhead','pullPlanFreshAhead') if k in r]
pm=lambda k: st.median([x['daemonMs']['publishMs'] for x in r[k]['runs'] if x.get('daemonMs')])
print({k:(round(r[k]['fromWeightsSecondsMedian']*1e3,2),round(pm(k),2),r[k]['preparedSwitchMsMedian']) for k in ks}, 'd2d', r.get('deviceToDeviceSeconds'))
print('alt', json.dumps({k:{x:v for x,v in d.items() if x in ('seconds','totalSeconds','switchMs','overPinnedHostToDevice','GBps')} for k,d in r.get('alternatives',{}).items()}))
print('failed', [x['step'][:90] for x in r['steps'] if not x['ok']])
" 2>&1 | tail -3
  pack
done
# Issue 29 on an H200, where one came and time is left: the fill with GPU digests against without (A/A: the fill's code is the same in both addons).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ $SECONDS -lt 400 ]; then
  echo "== $(el) fill-aa"; timeout 170 bash bench/gpu/fill-digest-pair.sh $W/fill-aa /tmp/refroot/build/Release/weightd.node 2 > $W/fill-aa.log 2>&1; tail -4 $W/fill-aa.log; pack
fi
echo "== $(el) done"
