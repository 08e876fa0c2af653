# Issue 31: the client's pull_tensors batching (e9509a3: one request sent as it is, no per-entry
# encoding) against 42d99b9's client, the same addon and dist: update_cuda.py at 8.24 GB.
source .devrun/prep.sh > /dev/null 2>&1
rm -rf /tmp/refroot/clients/python && tar xJf .devrun/ref-client-42d99b9.tar.xz -C /tmp/refroot && rm -rf /tmp/refroot/dist && cp -r dist /tmp/refroot/dist && cp build/Release/weightd.node build/Release/weightd-keeper /tmp/refroot/build/Release/
U="--layers 20 --hidden 4096 --pull-reps 5"
for which in ref:/tmp/refroot new:$PWD ref2:/tmp/refroot new2:$PWD; do
  name=u8g-${which%%:*}; root=${which#*:}
  echo "== $(el) $name"; (cd $root && PYTHONPATH=$root/clients/python:/tmp/site timeout 150 python3 test/gpu/update_cuda.py --out-dir $W/$name $U > $W/$name.log 2>&1; echo "rc $?" >> $W/$name.log); tail -1 $W/$name.log
  rm -rf /var/tmp/weightd-update-cuda-*
  python3 -c "
import json,statistics as st
r=json.load(open('$W/$name/update-cuda.json'))
rows=r['pullFlatAhead']['runs']
print({k:(round(r[k]['fromWeightsSecondsMedian']*1e3,2),r[k]['preparedSwitchMsMedian']) for k in ('pull','pullFlat','pullFlatPrepared','pullFlatAhead')})
print('ahead requestMs', sorted(x.get('clientPullMs',{}).get('requestMs',0) for x in rows), 'failed', [x['name'] for x in r['steps'] if not x['ok']])
" 2>&1 | tail -3
  pack
done
echo "== $(el) done"
