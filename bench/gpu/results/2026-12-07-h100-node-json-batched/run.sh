# Issue 31: update_cuda.py on main 8399fdf (ref) and this tree (new: node.json's listing of
# versions written once per 100 ms, a host commit adopted on the main thread), new first.
source .devrun/prep2.sh > /tmp/prep.log 2>&1; tail -4 /tmp/prep.log
U="--layers 20 --hidden 4096 --pull-reps 3"
for which in new:$PWD ref:/tmp/refroot; do
  name=u8n-${which%%:*}; root=${which#*:}
  case $name in *ref) [ $SECONDS -lt 170 ] || { echo "== $(el) $name skipped (time)"; continue; } ;; esac
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
echo "== $(el) done"
