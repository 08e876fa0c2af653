# Issue 33: where an adopting cuda restart's time goes before READY. Node alone, --version, the
# addon's cudaProbe alone and beside warmCuda (fresh processes), then restart.js on 1 GiB, plain
# and with --cpu-prof; base (943a50e) and new paired by bench/gpu/restart-pair.sh.
source .devrun/prep.sh
env | grep -E "^NODE|SSL" > $W/env.txt; cat $W/env.txt; lscpu | grep -E 'Model name|^CPU\(s\)|MHz' > $W/cpu.txt; cat $W/cpu.txt
python3 - > $W/spawn.jsonl <<'PY'
import subprocess, time, json
for name, cmd in (('node -e 0', ['node', '-e', '0']), ('weightd --version', ['./weightd', '--version'])):
    ms = []
    for i in range(10):
        t = time.perf_counter(); subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True); ms.append(round((time.perf_counter() - t) * 1000, 1))
    print(json.dumps({'what': name, 'ms': ms, 'median': sorted(ms)[5]}))
PY
cat $W/spawn.jsonl
for i in 1 2 3 4 5; do node -e "const a=performance.now(); require('pino'); console.log('user code at', a.toFixed(1), 'pino', (performance.now()-a).toFixed(1))"; done | tee $W/node-start.txt
WEIGHTD_CODE_CACHE_DEBUG=1 ./weightd --version
for i in 1 2 3 4 5; do for m in probe warm warm0; do node bench/gpu/cuda-start-probe.mjs $m; done; done > $W/cuda-start-probe.jsonl 2>&1; cat $W/cuda-start-probe.jsonl
CK=/var/tmp/ck1g
timeout 120 python3 bench/gpu/make-checkpoint.py --out $CK --gib 1 --shards 1 | tail -1
(cd /tmp/refroot && tar cJf /tmp/base.tar.xz weightd package.json scripts/node-flags dist build/Release)
echo "== $(el) restart pair, 1 GiB: base 943a50e, new (pino bundled, launcher without NODE_EXTRA_CA_CERTS)"; WEIGHTD_BENCH_CKPT=$CK timeout 150 bash bench/gpu/restart-pair.sh $W/restart-pair 4 /tmp/base.tar.xz 2>&1 | tail -9
echo "== $(el) restart profiled"; mkdir -p $W/prof
printf '#!/bin/sh\nexec node --max-semi-space-size=1 --cpu-prof --cpu-prof-dir=%s --cpu-prof-interval=200 %s/dist/launch.cjs "$@"\n' $W/prof $PWD > /tmp/wprof.sh; chmod +x /tmp/wprof.sh
WEIGHTD_BIN=/tmp/wprof.sh timeout 120 node dist/bench/restart.js --model $CK --out $W/restart-prof --runs 2 --device cuda --cuda-handles fd | tail -1
ls $W/prof | head
pack; echo "== $(el) done"
