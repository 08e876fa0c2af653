// Planning time for a very large checkpoint: a synthetic Llama-named index of ~100k tensors over
// 100 shards (sparse files: headers are real, data is holes), planned for tp 8. Prints one JSON
// line. The main thread's event-loop delay is recorded too, since parsing must not stall it.
//
//   node dist/bench/plan-100k.js [--tensors 100000] [--files 100] [--tp 8] [--runs 3]

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { planCheckpoint } from '../src/checkpoint/planCheckpoint.js';
import { writeSafetensors, type TensorToWrite } from '../src/checkpoint/writeSafetensors.js';

const { values } = parseArgs({
  options: {
    tensors: { type: 'string', default: '100000' },
    files: { type: 'string', default: '100' },
    tp: { type: 'string', default: '8' },
    runs: { type: 'string', default: '3' },
  },
});
const TENSORS = Number(values.tensors), FILES = Number(values.files), TP = Number(values.tp), RUNS = Number(values.runs);

const HIDDEN = 1024, HEADS = 16, KV_HEADS = 8, HEAD_DIM = 64, INTER = 2816, VOCAB = 32000;
const PER_LAYER = 9;

function layerTensors(layer: number): TensorToWrite[] {
  const p = `model.layers.${layer}`;
  const t = (name: string, shape: number[]): TensorToWrite => ({ name: `${p}.${name}`, dtype: 'BF16', shape });
  return [
    t('input_layernorm.weight', [HIDDEN]),
    t('self_attn.q_proj.weight', [HEADS * HEAD_DIM, HIDDEN]),
    t('self_attn.k_proj.weight', [KV_HEADS * HEAD_DIM, HIDDEN]),
    t('self_attn.v_proj.weight', [KV_HEADS * HEAD_DIM, HIDDEN]),
    t('self_attn.o_proj.weight', [HIDDEN, HEADS * HEAD_DIM]),
    t('post_attention_layernorm.weight', [HIDDEN]),
    t('mlp.gate_proj.weight', [INTER, HIDDEN]),
    t('mlp.up_proj.weight', [INTER, HIDDEN]),
    t('mlp.down_proj.weight', [HIDDEN, INTER]),
  ];
}

async function makeCheckpoint(dir: string): Promise<number> {
  const layers = Math.max(1, Math.round((TENSORS - 3) / PER_LAYER));
  const all: TensorToWrite[] = [{ name: 'model.embed_tokens.weight', dtype: 'BF16', shape: [VOCAB, HIDDEN] }];
  for (let l = 0; l < layers; l++) all.push(...layerTensors(l));
  all.push({ name: 'model.norm.weight', dtype: 'BF16', shape: [HIDDEN] }, { name: 'lm_head.weight', dtype: 'BF16', shape: [VOCAB, HIDDEN] });
  const weightMap: Record<string, string> = {};
  const per = Math.ceil(all.length / FILES);
  for (let f = 0; f < FILES; f++) {
    const file = `model-${String(f + 1).padStart(5, '0')}-of-${String(FILES).padStart(5, '0')}.safetensors`;
    const part = all.slice(f * per, (f + 1) * per);
    await writeSafetensors(join(dir, file), part);
    for (const t of part) weightMap[t.name] = file;
  }
  writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: {}, weight_map: weightMap }));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'], hidden_size: HIDDEN, num_attention_heads: HEADS, num_key_value_heads: KV_HEADS,
    head_dim: HEAD_DIM, intermediate_size: INTER, vocab_size: VOCAB, tie_word_embeddings: false, torch_dtype: 'bfloat16',
  }));
  return all.length;
}

const dir = mkdtempSync(join(tmpdir(), 'weightd-bench-plan-'));
try {
  const tensors = await makeCheckpoint(dir);
  const runs: Array<{ ms: number; loopDelayMaxMs: number }> = [];
  let ops = 0;
  for (let r = 0; r < RUNS; r++) {
    const delay = monitorEventLoopDelay({ resolution: 5 });
    delay.enable();
    const started = performance.now();
    const plan = await planCheckpoint(dir, { tpSize: TP });
    const ms = performance.now() - started;
    delay.disable();
    ops = plan.ranks[0]!.ops.length;
    runs.push({ ms: Math.round(ms), loopDelayMaxMs: Math.round(delay.max / 1e6) });
  }
  const sorted = runs.map((r) => r.ms).sort((a, b) => a - b);
  console.log(JSON.stringify({
    bench: 'plan-100k',
    tensors,
    files: FILES,
    tpSize: TP,
    opsPerRank: ops,
    medianMs: sorted[Math.floor(sorted.length / 2)],
    runs,
    machine: `${availableParallelism()} cores (${cpus()[0]?.model.trim() ?? 'unknown cpu'}), node ${process.versions.node}`,
  }));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
