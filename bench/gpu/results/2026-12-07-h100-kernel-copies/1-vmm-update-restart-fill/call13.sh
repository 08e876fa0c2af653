# Issue 31 then 33 (and 29 if time is left), one call. The 8.24 GB pull update (update_cuda.py):
# main 60769f9 ("ref", with its own digest kernel: the job layout changed) against this build
# (d99b05b: the pull's copies made by the digest kernel as it hashes; 969e6a1: the update's
# descriptors closed off the commit's reply). Then the cuda start and adopting restart, base
# 1f3229b (its own kernel) against this build (restart-pair.sh), then issue 29's fill pair.
source .devrun/prep.sh
T0=$SECONDS
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc); ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
rm -rf /tmp/r60 && mkdir -p /tmp/r60 && tar xJf .devrun/ref60.tar.xz -C /tmp/r60
bash /tmp/r60/native/gpu/build-kernel.sh "$NVCC" /tmp/oldkernel.fatbin "$ARCH" > $W/oldkernel.log 2>&1; echo "old kernel rc=$? $(ls -la /tmp/oldkernel.fatbin 2>&1)"
cp /tmp/oldkernel.fatbin /tmp/refroot/build/Release/weightd-digests.fatbin
rm -rf /tmp/ref60root && mkdir -p /tmp/ref60root && tar cf - --exclude=./.devrun --exclude=./.device --exclude=./.git --exclude=./node_modules . | tar xf - -C /tmp/ref60root && ln -s $PWD/node_modules /tmp/ref60root/node_modules
rm -rf /tmp/ref60root/dist && cp -r /tmp/r60/dist /tmp/ref60root/dist && cp /tmp/r60/build/Release/weightd.node /tmp/r60/build/Release/weightd-keeper /tmp/ref60root/build/Release/ && cp /tmp/oldkernel.fatbin /tmp/ref60root/build/Release/weightd-digests.fatbin
echo "== $(el) VMM release probe"; PYTHONPATH=$PWD/clients/python:/tmp/site timeout 60 python3 bench/gpu/vmm-release-probe.py 83 100 3 > $W/vmm-probe.json 2>&1; cut -c1-400 $W/vmm-probe.json
U="--layers 20 --hidden 4096 --pull-reps 5"
run() {
  echo "== $(el) $1"; (cd $2 && PYTHONPATH=$2/clients/python:/tmp/site timeout 200 python3 test/gpu/update_cuda.py --out-dir $W/$1 $U > $W/$1.log 2>&1; echo "rc $?" >> $W/$1.log); tail -1 $W/$1.log
  rm -rf /var/tmp/weightd-update-cuda-*
  python3 -c "
import json,statistics as s
r=json.load(open('$W/$1/update-cuda.json'))
print({k:(round(r[k]['updateSecondsMedian']*1e3,1),round(r[k].get('fromWeightsSecondsMedian',0)*1e3,1),r[k]['preparedSwitchMsMedian']) for k in ('pull','pullFlat','pullFlatPrepared','pullFlatAhead') if k in r})
rows=r['pullFlatAhead']['runs']
for k in ('commitRestMs',): print(k, sorted(x[k] for x in rows))
print('pull copyMs', sorted(x['pullMs']['copyMs'] for x in rows), 'setupMs', sorted(x['pullMs'].get('setupMs', -1) for x in rows), 'nativeMs', sorted(x['pullMs']['nativeMs'] for x in rows), 'byKernel', rows[0]['pullMs'].get('copiedByKernelBytes'))
cp=[x.get('clientPullMs',{}) for x in rows]; print('clientPull', {k: sorted(c.get(k,0) for c in cp) for k in ('syncMs','locateMs','requestMs')})
print('failed steps', [x['name'] for x in r['steps'] if not x['ok']])
" 2>&1 | tail -8
  pack
}
run u8g-ref /tmp/ref60root
run u8g-new $PWD
(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
if [ $((SECONDS-T0)) -lt 330 ]; then
echo "== $(el) restart pair 8.56 GB (elapsed $((SECONDS-T0)) s)"; timeout 150 bash bench/gpu/restart-pair.sh $W/restart-pair 3 /tmp/base.tar.xz 2>&1 | tail -7; pack
fi
for f in $W/restart-pair/*/daemon.jsonl; do echo "$(basename $(dirname $f)) $(python3 -c "
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
if [ $((SECONDS-T0)) -lt 380 ]; then
  echo "== $(el) fill digest pair (issue 29), $(nvidia-smi --query-gpu=name --format=csv,noheader)"; timeout 150 bash bench/gpu/fill-digest-pair.sh $W/fill-pair /tmp/refroot/build/Release/weightd.node 1 /tmp/oldkernel.fatbin > $W/fill-pair.log 2>&1; tail -4 $W/fill-pair.log
fi
pack; echo "== $(el) done ($((SECONDS-T0)) s)"
