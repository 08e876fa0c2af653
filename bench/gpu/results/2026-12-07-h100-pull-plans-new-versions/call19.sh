# Issue 31: as call18, the round of new versions fixed (each seed's bytes as it says); new also has
# the node's whole status built only when its state changes (see git log). Ref: f2c108f.
# Then, on an H200 only, issue 29's fill with GPU digests against without.
W=/tmp/w; mkdir -p $W; source .devrun/prep.sh > $W/prep.log 2>&1; tail -3 $W/prep.log
U="--layers 20 --hidden 4096 --pull-reps 5"
for which in ref:/tmp/refroot new:$PWD ref2:/tmp/refroot new2:$PWD; do
  name=u8g-${which%%:*}; root=${which#*:}
  echo "== $(el) $name"; (cd $root && PYTHONPATH=$root/clients/python:/tmp/site timeout 240 python3 test/gpu/update_cuda.py --out-dir $W/$name $U > $W/$name.log 2>&1; echo "rc $?" >> $W/$name.log); tail -1 $W/$name.log
  rm -rf /var/tmp/weightd-update-cuda-*
  python3 -c "
import json
r=json.load(open('$W/$name/update-cuda.json'))
ks=[k for k in ('pull','pullFlat','pullFlatPrepared','pullFlatAhead','pullPlanFlatAhead','pullPlanAhead','pullPlanFreshAhead') if k in r]
print({k:(round(r[k]['fromWeightsSecondsMedian']*1e3,2),r[k]['preparedSwitchMsMedian']) for k in ks})
print('failed', [x['step'][:90] for x in r['steps'] if not x['ok']], 'planOpen', r.get('planOpen'))
" 2>&1 | tail -3
  pack
done
# Issue 29 on this machine (an H200 where one came): the fill with GPU digests against without,
# this addon against itself (A/A: the fill's code is the same in both builds), 3 rounds.
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo "== $(el) fill-aa" && timeout 240 bash bench/gpu/fill-digest-pair.sh $W/fill-aa /tmp/refroot/build/Release/weightd.node 3 > $W/fill-aa.log 2>&1; tail -4 $W/fill-aa.log; pack
echo "== $(el) done"
