// Host backend, one run, ratios against baselines measured in the same run:
//   fill:   the daemon filling its arena (tp=1 and tp=2) vs a plain sequential read of the same
//           files, page cache hot;
//   attach: a client mapping a whole resident rank vs reading that rank's bytes from disk.
// Usage: node dist/bench/host-load-attach.js [GiB=1]. Prints one JSON line.
import { randomFillSync } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, mkdtempSync, readFileSync, openSync, readSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { writeSafetensors, type TensorToWrite } from '../src/checkpoint/writeSafetensors.js';
import { WeightdClient, expectedFingerprint } from '../src/client/index.js';
import { startNode } from '../src/startNode.js';

const gib = Number(process.argv[2] ?? 1);
// WEIGHTD_BENCH_DIR keeps the generated checkpoint there (reused when present) for reruns.
const keepDir = process.env.WEIGHTD_BENCH_DIR;
const dir = keepDir ?? mkdtempSync(join(tmpdir(), 'weightd-bench-'));
const socketDir = mkdtempSync(join(tmpdir(), 'weightd-bench-sock-'));

/** A Llama-shaped checkpoint (hidden 2048) with as many layers as fit in `gib`, random bf16. */
async function makeCheckpoint(): Promise<number> {
  if (keepDir && existsSync(join(keepDir, 'model.safetensors.index.json'))) {
    return (JSON.parse(readFileSync(join(keepDir, 'model.safetensors.index.json'), 'utf8')) as { metadata: { total_size: number } }).metadata.total_size;
  }
  mkdirSync(dir, { recursive: true });
  const h = 2048, inter = 5632, vocab = 32000, kv = 512;
  const layerTensors = (l: number): Array<[string, number[]]> => [
    [`model.layers.${l}.self_attn.q_proj.weight`, [h, h]],
    [`model.layers.${l}.self_attn.k_proj.weight`, [kv, h]],
    [`model.layers.${l}.self_attn.v_proj.weight`, [kv, h]],
    [`model.layers.${l}.self_attn.o_proj.weight`, [h, h]],
    [`model.layers.${l}.mlp.gate_proj.weight`, [inter, h]],
    [`model.layers.${l}.mlp.up_proj.weight`, [inter, h]],
    [`model.layers.${l}.mlp.down_proj.weight`, [h, inter]],
    [`model.layers.${l}.input_layernorm.weight`, [h]],
    [`model.layers.${l}.post_attention_layernorm.weight`, [h]],
  ];
  const bytesOf = (shape: number[]) => shape.reduce((a, b) => a * b, 1) * 2;
  const layerBytes = layerTensors(0).reduce((a, [, s]) => a + bytesOf(s), 0);
  const layers = Math.max(2, Math.round((gib * 2 ** 30 - 2 * vocab * h * 2) / layerBytes));
  const all: Array<[string, number[]]> = [['model.embed_tokens.weight', [vocab, h]], ['model.norm.weight', [h]], ['lm_head.weight', [vocab, h]]];
  for (let l = 0; l < layers; l++) all.push(...layerTensors(l));
  // About 1 GiB per shard, as save_pretrained does with its default max_shard_size.
  const shards: Array<Array<[string, number[]]>> = [[]];
  let size = 0;
  for (const t of all) {
    if (size > 2 ** 30) shards.push([]), (size = 0);
    shards.at(-1)!.push(t);
    size += bytesOf(t[1]);
  }
  const weightMap: Record<string, string> = {};
  let total = 0;
  for (let i = 0; i < shards.length; i++) {
    const file = `model-${String(i + 1).padStart(5, '0')}-of-${String(shards.length).padStart(5, '0')}.safetensors`;
    const tensors: TensorToWrite[] = shards[i]!.map(([name, shape]) => {
      weightMap[name] = file;
      total += bytesOf(shape);
      return { name, dtype: 'BF16', shape, data: randomFillSync(new Uint8Array(bytesOf(shape))) };
    });
    await writeSafetensors(join(dir, file), tensors);
  }
  writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'], hidden_size: h, intermediate_size: inter, num_attention_heads: 16,
    num_key_value_heads: 4, num_hidden_layers: layers, vocab_size: vocab, tie_word_embeddings: false, torch_dtype: 'bfloat16',
  }));
  return total;
}

/** Reads every checkpoint file front to back in 16 MiB blocks; returns seconds. */
function sequentialRead(): number {
  const buf = Buffer.allocUnsafe(16 << 20);
  const t0 = performance.now();
  for (const f of readdirSync(dir).filter((n) => n.endsWith('.safetensors')).sort()) {
    const fd = openSync(join(dir, f), 'r');
    while (readSync(fd, buf, 0, buf.length, null) > 0);
    closeSync(fd);
  }
  return (performance.now() - t0) / 1000;
}

async function fill(tp: number) {
  const t0 = performance.now();
  const node = await startNode({ model: dir, tensorParallelSize: tp, device: 'host', socketDir, logger: pino({ level: 'silent' }) });
  const status = await node.ready;
  // Start to READY: planning, allocation (with its page population) and the fill.
  const seconds = (performance.now() - t0) / 1000;
  const bytes = status.ranks.reduce((a, r) => a + r.bytes, 0);
  return { node, status, seconds, bytes };
}

try {
  const total = await makeCheckpoint();
  sequentialRead(); // warm the page cache
  const readS = Math.min(sequentialRead(), sequentialRead());
  const readGBs = total / readS / 1e9;

  const one = await fill(1);
  const fill1GBs = one.bytes / one.seconds / 1e9;
  // Attach: map all of rank 0 and touch one byte per page, so the mapping is really usable.
  const expected = await expectedFingerprint(dir, 1, 0);
  const attachTimes: number[] = [];
  for (let i = 0; i < 5; i++) {
    const t0 = performance.now();
    const client = await WeightdClient.connect(one.status.ranks[0]!.socketPath!);
    const att = await client.attach(expected);
    if (att.status !== 'attached') throw new Error(`attach failed: ${JSON.stringify(att)}`);
    attachTimes.push(performance.now() - t0);
    await att.detach();
    await client.close();
  }
  await one.node.stop();
  const attachMs = attachTimes.sort((a, b) => a - b)[2]!;

  const two = await fill(2);
  const fill2GBs = two.bytes / two.seconds / 1e9;
  await two.node.stop();

  console.log(JSON.stringify({
    bench: 'host-load-attach',
    date: new Date().toISOString(),
    machine: `${cpus().length} cores, ${cpus()[0]?.model ?? 'unknown'}, node ${process.version}`,
    checkpointBytes: total,
    sequentialReadGBs: +readGBs.toFixed(2),
    fillTp1GBs: +fill1GBs.toFixed(2),
    fillTp1VsRead: +(fill1GBs / readGBs).toFixed(2),
    fillTp2GBs: +fill2GBs.toFixed(2),
    fillTp2VsRead: +(fill2GBs / readGBs).toFixed(2),
    attachMedianMs: +attachMs.toFixed(2),
    readRankFromDiskMs: +(readS * 1000).toFixed(1),
    attachSpeedupVsDisk: +((readS * 1000) / attachMs).toFixed(1),
  }));
} finally {
  for (const d of keepDir ? [socketDir] : [dir, socketDir]) rmSync(d, { recursive: true, force: true });
}
