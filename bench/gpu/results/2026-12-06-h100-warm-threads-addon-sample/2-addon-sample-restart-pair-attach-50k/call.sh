# Issue 33: a cuda start to READY and a restart that adopts (restart-pair.sh), this build (rank
# threads started warm, and the content sample read by the addon) against main 17b7160's,
# alternating, 4 pairs; then the 50k-tensor attach and the daemon's peak RSS (attach-50k.sh),
# this client against 5cb8fc9's (before attach round 3).
source .devrun/prep.sh
cp .devrun/new-release/* build/Release/
(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
echo "== $(el) restart pair"; timeout 170 bash bench/gpu/restart-pair.sh $W/restart-pair 4 /tmp/base.tar.xz 2>&1 | tail -9
for f in $W/restart-pair/*/daemon.jsonl; do echo "$(basename $(dirname $f)) $(python3 -c "
import json,sys
out=[]
for l in open('$f'):
    d=json.loads(l)
    if d.get('which')!='loaded': continue
    m=d['msg']
    for k,n in (('control socket','sock'),('checkpoint planned','plan'),('single node','table'),('allocated','alloc'),('rank 0 loaded','loaded'),('READY','READY')):
        if m.startswith(k) or (k in m and k!='READY'): out.append(f\"{n}={d['sinceStartMs']}\"+(f\"({d['ms']})\" if 'ms' in d else '')); break
print(' '.join(out))")"; done
pack
echo "== $(el) attach 50k"; OUT=$W/attach-50k WEIGHTD_BEFORE_CLIENT=.devrun/before-client timeout 370 bash bench/gpu/attach-50k.sh > /dev/null 2>&1; echo "rc $?"
cat $W/attach-50k/attach-pair.txt $W/attach-50k/attach-concurrent.txt 2>/dev/null | tail -12; cat $W/attach-50k/rss/*.txt 2>/dev/null | tail -8
pack; echo "== $(el) done"
