# Issue 33, after arenaTensorDigests' fix: the daemon's peak RSS and READY at 50,438 tensors
# (daemon-peak-rss.sh, --max-semi-space-size=1, the launchers' flag), this build and main
# 17b7160's, 2 runs each; then the 8.56 GB start to READY pair again (2 pairs).
source .devrun/prep.sh
cp .devrun/new-release/* build/Release/
CK=/var/tmp/ck50k
timeout 120 python3 bench/gpu/make-checkpoint.py --out $CK --gib 1.2 --hidden 128 --inter 128 --kv 128 --vocab 1024 --shards 4 | tail -1; cat $CK/*.safetensors > /dev/null
echo "== $(el) peak RSS at 50k"
for b in base new; do
  root=$PWD; [ $b = base ] && root=/tmp/refroot
  timeout 100 bash $root/bench/daemon-peak-rss.sh $CK cuda $W/rss50k-$b 1 > /dev/null 2>&1
  echo "$b"; cat $W/rss50k-$b/peak-rss.jsonl
  grep -h '"msg":"rank 0 loaded\|all 1 local ranks loaded\|checkpoint planned' $W/rss50k-$b/*.log | grep -o '"sinceStartMs":[0-9]*' | tr '\n' ' '; echo
done
pack
(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
echo "== $(el) restart pair"; timeout 110 bash bench/gpu/restart-pair.sh $W/restart-pair 2 /tmp/base.tar.xz 2>&1 | tail -7
for f in $W/restart-pair/*/daemon.jsonl; do echo "$(basename $(dirname $f)) $(python3 -c "
import json
out=[]
for l in open('$f'):
    d=json.loads(l)
    if d.get('which')!='loaded': continue
    m=d['msg']
    for k,n in (('control socket','sock'),('CUDA devices','cuda'),('checkpoint planned','plan'),('single node','table'),('allocated','alloc'),('rank 0 loaded','loaded'),('READY','READY')):
        if m.startswith(k) or (k in m and k!='READY'): out.append(f\"{n}={d['sinceStartMs']}\"+(f\"({d['ms']})\" if 'ms' in d else '')); break
print(' '.join(out))")"; done
pack; echo "== $(el) done"
