#!/usr/bin/env bash
# `weightd verify` on a 2 GB checkpoint (issue 29's size; CI runs 72 MiB, test/cli/verify.test.ts):
# a host daemon at tp=2 serves it, verify finds it equal; in a copy of it one byte is flipped
# outside the fingerprint's sample (in the daemon's own files a write would mark it stale), and
# verify of the copy names the tensor (exit 1). Prints each step's seconds.
# Run from the repository root after `npm run build`; needs ~5 GB of memory and 2 GB of disk.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work=$(mktemp -d "${TMPDIR:-/tmp}/weightd-verify-2gb-XXXXXX")
daemon=
cleanup() { [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
now() { date +%s.%N; }
# 16 layers of hidden 2048, intermediate 8192, vocab 32000: 2.2 GB of bf16 in 4 shards.
node --input-type=module -e '
  const { writeArchCheckpoint } = await import("./dist/test/helpers/checkpoints.js");
  const fs = await import("node:fs");
  fs.mkdirSync(process.argv[1]);
  await writeArchCheckpoint(process.argv[1], "LlamaForCausalLM", { hidden: 2048, heads: 16, kvHeads: 8, intermediate: 8192, vocab: 32000, layers: 16, shards: 4 });
' "$work/model"
du -sh "$work/model"
WEIGHTD_HOST_DEVICES=verify2gb-0,verify2gb-1 node dist/main.js --model "$work/model" -tp 2 --device host \
  --weight-cache-socket-dir "$work/s" 2> "$work/daemon.log" &
daemon=$!
until grep -q '"msg":"READY' "$work/daemon.log"; do kill -0 "$daemon"; sleep 0.5; done
grep -o '"msg":"READY[^"]*"' "$work/daemon.log"
t=$(now); rc=0; node dist/main.js verify --model "$work/model" -tp 2 --weight-cache-socket-dir "$work/s" || rc=$?
echo "equal: exit $rc in $(node -p "($(now) - $t).toFixed(2)") s"
victim=model.layers.9.mlp.down_proj.weight
cp -r "$work/model" "$work/copy"
node --input-type=module -e '
  const { parseSafetensors } = await import("./dist/src/checkpoint/parseSafetensors.js");
  const fs = await import("node:fs");
  const [dir, name] = process.argv.slice(1);
  const index = JSON.parse(fs.readFileSync(`${dir}/model.safetensors.index.json`, "utf8"));
  const file = `${dir}/${index.weight_map[name]}`;
  const t = (await parseSafetensors(file)).tensors.find((x) => x.name === name);
  const fd = fs.openSync(file, "r+"), b = Buffer.alloc(1), at = t.begin + 128 + 4096 + 100;
  fs.readSync(fd, b, 0, 1, at); b[0] ^= 0xff; fs.writeSync(fd, b, 0, 1, at); fs.closeSync(fd);
  console.log(`flipped byte ${at} of ${file} (${name})`);
' "$work/copy" "$victim"
t=$(now); rc=0; node dist/main.js verify --model "$work/copy" -tp 2 --weight-cache-socket-dir "$work/s" || rc=$?
echo "one byte flipped: exit $rc in $(node -p "($(now) - $t).toFixed(2)") s"
