# Issues 31 and 33, one call, against main a636ee6 (this session's start; the same kernel).
# 1. The 8.24 GB update (update_cuda.py): a switch's releases and old lease let go of after it
#    returns (0f4a78a), against a636ee6's client; a pull's GPU resources let go of after its
#    answer (the addon's releaser thread), against a636ee6's addon. 2. The cuda start and adopting restart
#    (restart-pair.sh): the kept plan read while cuInit runs (d2ff142) and the page cache share
#    with it (92901d0), the launcher without forks
#    (1ac7182), against a636ee6. Each part runs only if the time left allows it.
source .devrun/prep.sh
T0=$SECONDS
U="--layers 20 --hidden 4096 --pull-reps 5"
run() {
  echo "== $(el) $1"; (cd $2 && PYTHONPATH=$2/clients/python:/tmp/site timeout 200 python3 test/gpu/update_cuda.py --out-dir $W/$1 $U > $W/$1.log 2>&1; echo "rc $?" >> $W/$1.log); tail -1 $W/$1.log
  rm -rf /var/tmp/weightd-update-cuda-*
  python3 -c "
import json
r=json.load(open('$W/$1/update-cuda.json'))
print({k:(round(r[k]['updateSecondsMedian']*1e3,1),round(r[k].get('fromWeightsSecondsMedian',0)*1e3,1),r[k]['switchMsMedian'],r[k]['preparedSwitchMsMedian']) for k in ('pull','pullFlat','pullFlatPrepared','pullFlatAhead') if k in r})
for k in ('pull','pullFlat','pullFlatPrepared','pullFlatAhead'):
    rows=r[k]['runs']; print(k, 'prepared switch', sorted(x['switchMs'] for x in rows if x.get('prepared')), 'remap', sorted(x['remapMs'] for x in rows if x.get('prepared')))
rows=r['pullFlatAhead']['runs']
print('ahead: commitRestMs', sorted(x['commitRestMs'] for x in rows), 'copyMs', sorted(x['pullMs']['copyMs'] for x in rows), 'setupMs', sorted(x['pullMs'].get('setupMs', -1) for x in rows), 'moduleMs', sorted(x['pullMs'].get('moduleMs', -1) for x in rows), 'releaseMs', sorted(x['pullMs'].get('releaseMs', -1) for x in rows), 'nativeMs', sorted(x['pullMs']['nativeMs'] for x in rows))
cp=[x.get('clientPullMs',{}) for x in rows]; print('clientPull', {k: sorted(c.get(k,0) for c in cp) for k in ('syncMs','locateMs','requestMs')})
print('failed steps', [x['name'] for x in r['steps'] if not x['ok']])
" 2>&1 | tail -8
  pack
}
run u8g-ref /tmp/refroot
run u8g-new $PWD
(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
summ() {
for f in $W/$1/*/daemon.jsonl; do echo "$(basename $(dirname $f)) $(python3 -c "
import json
for which in ('loaded', 'adopted'):
    out=[]
    for l in open('$f'):
        d=json.loads(l)
        if d.get('which')!=which: continue
        m=d['msg']
        for k,n in (('control socket','sock'),('CUDA devices','cuda'),('checkpoint planned','plan'),('rank table','table'),('allocated','alloc'),('loaded 8','loaded'),('adopted 8','adopted'),('READY','READY')):
            if m.startswith(k) or (k in m and k!='READY'): out.append(f\"{n}={d['sinceStartMs']}\"); break
    print(which, ' '.join(out), end=' | ')")"; done
}
if [ $((SECONDS-T0)) -lt 330 ]; then
  echo "== $(el) restart pair 8.56 GB (elapsed $((SECONDS-T0)) s)"; timeout 150 bash bench/gpu/restart-pair.sh $W/restart-pair 3 /tmp/base.tar.xz 2>&1 | tail -7; pack; summ restart-pair
fi
if [ $((SECONDS-T0)) -lt 420 ]; then
  echo "== $(el) restart pair again (elapsed $((SECONDS-T0)) s)"; timeout 150 bash bench/gpu/restart-pair.sh $W/restart-pair-2 3 /tmp/base.tar.xz 2>&1 | tail -7; pack; summ restart-pair-2
fi
if [ $((SECONDS-T0)) -lt 470 ]; then
  # Issue 29: the fill's path is the same in both addons (only the pull's releases changed): an A/A pair.
  echo "== $(el) fill digest pair, a636ee6's addon against this (elapsed $((SECONDS-T0)) s)"; timeout 100 bash bench/gpu/fill-digest-pair.sh $W/fill-aa /tmp/refroot/build/Release/weightd.node 1 > $W/fill-aa.log 2>&1; tail -4 $W/fill-aa.log
fi
pack; echo "== $(el) done ($((SECONDS-T0)) s)"
