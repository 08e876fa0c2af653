# Issue 29 and 31 in one call: (1) the fill with GPU digests against without, this build (digest
# kernels loaded once per context) paired with main 62d77ad's addon; (2) update_cuda.py at 8.24 GB,
# this tree (packed manifest once per layout, kernels kept, the switch's split) against 62d77ad.
export PYTHONUNBUFFERED=1 W=/tmp/w
mkdir -p $W /tmp/nodebin && xz -dc .device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node && export PATH=/tmp/nodebin:$PATH
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
[ -d node_modules ] || tar xJf .devrun/nm.tar.xz
rm -rf dist && mkdir -p dist && tar xJf .devrun/dist.tar.xz -C dist
el() { date -u +%T; }
pack() { cp -r $W/. $OUT/ 2>/dev/null; }
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
echo "== $(el) fill pair"
timeout 270 bash bench/gpu/fill-digest-pair.sh $W/fill-pair .devrun/ref-62d77ad/weightd.node 2 2>&1 | tail -6
pack
rm -rf /tmp/refroot && mkdir /tmp/refroot && tar cf - --exclude=./.devrun --exclude=./.device --exclude=./.git --exclude=./node_modules --exclude=./.whl --exclude=./dist --exclude=./bench/results --exclude=./bench/gpu/results . | tar xf - -C /tmp/refroot && tar xJf .devrun/ref-62d77ad.tar.xz -C /tmp/refroot && ln -s $PWD/node_modules /tmp/refroot/node_modules && cp build/Release/weightd-digests.fatbin /tmp/refroot/build/Release/
U="--layers 20 --hidden 4096 --pull-reps 3"
for which in new:$PWD ref:/tmp/refroot; do
  name=u-${which%%:*}; root=${which#*:}
  [ $SECONDS -lt 430 ] || { echo "== $(el) $name skipped (time)"; continue; }
  echo "== $(el) $name"; (cd $root && PYTHONPATH=$root/clients/python:/tmp/site timeout 150 python3 test/gpu/update_cuda.py --out-dir $W/$name $U > $W/$name.log 2>&1; echo "rc $?" >> $W/$name.log); tail -1 $W/$name.log
  rm -rf /var/tmp/weightd-update-cuda-*
  python3 -c "
import json, statistics as st
r=json.load(open('$W/$name/update-cuda.json'))
ks=[k for k in ('pullFlatAhead','pullPlanFlatAhead','pullPlanAhead','pullPlanFreshAhead') if k in r]
pm=lambda k: st.median([x['daemonMs']['publishMs'] for x in r[k]['runs'] if x.get('daemonMs')])
print({k:(round(r[k]['fromWeightsSecondsMedian']*1e3,2),round(pm(k),2),r[k]['preparedSwitchMsMedian']) for k in ks}, 'd2d', r.get('deviceToDeviceSeconds'))
print('split', [x.get('remapSplitMs') for k in ks for x in r[k]['runs'] if x.get('prepared')][:4])
print('failed', [x['step'][:90] for x in r['steps'] if not x['ok']])
" 2>&1 | tail -4
  pack
done
echo "== $(el) done"
