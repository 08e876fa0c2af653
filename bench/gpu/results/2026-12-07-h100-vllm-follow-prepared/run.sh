# Issue 31 on a real CUDA vLLM 0.26: the follow case (an engine mapped from the daemon follows
# another version loaded under its name and back, through vLLM's weight-transfer calls), with the
# backend's switch prepared ahead at model_ready (preparedAhead in each step).
test -d /tmp/vsite/vllm || exit 3
[ -d node_modules ] || tar xJf .devrun/nm.tar.xz
rm -rf dist && mkdir -p dist && tar xJf .devrun/dist.tar.xz -C dist
source test/gpu/ensure-kernel.sh > /tmp/kernel.log 2>&1; tail -1 /tmp/kernel.log
nvidia-smi -L; date -u
timeout 520 bash test/gpu/vllm/run.sh --out-dir $OUT --models follow > $OUT/run.log 2>&1; echo "rc $?"
tail -5 $OUT/run.log
python3 -c "
import json; r=json.load(open('$OUT/vllm-suite.json'))
for n, m in r.get('models', {}).items(): print(n, json.dumps({k: m.get(k) for k in ('interface', 'steps', 'problems')})[:1500])
" 2>&1 | tail -5
date -u
