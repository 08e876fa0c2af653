# Issue 31: pull plans (the trainer's tensors named once; each update pulls them by one request,
# its memory opened and the digest kernel set up by the plan, not the update) and a full pull's
# commit with no native call, against main 6f946ea (its own dist, addon, client and script):
# update_cuda.py at 8.24 GB, ref, new, ref2, new2.
source .devrun/prep.sh > $W/prep.log 2>&1; tail -3 $W/prep.log
U="--layers 20 --hidden 4096 --pull-reps 5"
for which in ref:/tmp/refroot new:$PWD ref2:/tmp/refroot new2:$PWD; do
  name=u8g-${which%%:*}; root=${which#*:}
  echo "== $(el) $name"; (cd $root && PYTHONPATH=$root/clients/python:/tmp/site timeout 170 python3 test/gpu/update_cuda.py --out-dir $W/$name $U > $W/$name.log 2>&1; echo "rc $?" >> $W/$name.log); tail -1 $W/$name.log
  rm -rf /var/tmp/weightd-update-cuda-*
  python3 -c "
import json
r=json.load(open('$W/$name/update-cuda.json'))
ks=[k for k in ('pull','pullFlat','pullFlatPrepared','pullFlatAhead','pullPlanFlatAhead','pullPlanAhead') if k in r]
print({k:(round(r[k]['fromWeightsSecondsMedian']*1e3,2),r[k]['preparedSwitchMsMedian']) for k in ks})
print('failed', [x['name'][:80] for x in r['steps'] if not x['ok']], 'planOpen', r.get('planOpen'))
" 2>&1 | tail -3
  pack
done
echo "== $(el) done"
