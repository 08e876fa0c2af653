# Issue 33: a cuda start and an adopting restart, 8.56 GB, hot, --keeper spawn (bench/gpu/restart-pair.sh,
# 4 pairs): base 943a50e against new (pino bundled, the launchers without NODE_EXTRA_CA_CERTS, cuInit
# begun by the launcher, the bundle ASCII). Node's own start with and without the variable.
source .devrun/prep.sh
python3 - > $W/node-start.jsonl <<'PY'
import subprocess, time, json, os
env0 = {k: v for k, v in os.environ.items() if k != 'NODE_EXTRA_CA_CERTS'}
for name, env in (('node -e 0, NODE_EXTRA_CA_CERTS set', None), ('node -e 0, unset', env0)):
    ms = []
    for i in range(10):
        t = time.perf_counter(); subprocess.run(['node', '-e', '0'], env=env, check=True); ms.append(round((time.perf_counter() - t) * 1000, 1))
    print(json.dumps({'what': name, 'ms': ms, 'median': sorted(ms)[5]}))
PY
cat $W/node-start.jsonl
(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
echo "== $(el) restart pair 8.56 GB"; timeout 300 bash bench/gpu/restart-pair.sh $W/restart-pair 4 /tmp/base.tar.xz 2>&1 | tail -9
for f in $W/restart-pair/*/daemon.jsonl; do echo "$(basename $(dirname $f)) $(python3 -c "
import json
for which in ('loaded', 'adopted'):
    out=[]
    for l in open('$f'):
        d=json.loads(l)
        if d.get('which')!=which: continue
        m=d['msg']
        for k,n in (('control socket','sock'),('CUDA devices','cuda'),('checkpoint planned','plan'),('allocated','alloc'),('loaded 8','loaded'),('adopted 8','adopted'),('READY','READY')):
            if m.startswith(k) or (k in m and k!='READY'): out.append(f\"{n}={d['sinceStartMs']}\"); break
    print(which, ' '.join(out), end=' | ')")"; done
pack; echo "== $(el) done"
