// Generates examples/tiny-llama: a Llama-architecture checkpoint with random BF16 weights, in
// the exact layout Hugging Face writes (config.json, two shards, model.safetensors.index.json),
// small enough to commit and to run the daemon on a laptop. Shapes divide for tp 1, 2, 4 and 8
// (8 heads, 4 KV heads: tp 8 exercises KV-head replication). The output is byte-identical on
// every run: a fixed-seed PRNG, a fixed tensor order, and sorted JSON keys.
//
//   node dist/scripts/make-example.js [outDir]     (default: examples/tiny-llama)

import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { canonicalJson } from '../src/checkpoint/canonicalJson.js';
import { writeSafetensors, type TensorToWrite } from '../src/checkpoint/writeSafetensors.js';

const CONFIG = {
  architectures: ['LlamaForCausalLM'],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 1,
  eos_token_id: 2,
  head_dim: 32,
  hidden_act: 'silu',
  hidden_size: 256,
  initializer_range: 0.02,
  intermediate_size: 688,
  max_position_embeddings: 2048,
  mlp_bias: false,
  model_type: 'llama',
  num_attention_heads: 8,
  num_hidden_layers: 4,
  num_key_value_heads: 4,
  rms_norm_eps: 1e-5,
  rope_theta: 10000.0,
  tie_word_embeddings: false,
  torch_dtype: 'bfloat16',
  vocab_size: 4096,
};
const SEED = 0x5eed1e55;
/** Layers [0, SPLIT_LAYER) go to the first shard with the embedding, the rest to the second. */
const SPLIT_LAYER = 2;

/** mulberry32: tiny, well-mixed, and identical on every platform (32-bit integer math only). */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** float32 -> bfloat16 bits, rounding to nearest even like torch's conversion. */
function toBf16(value: number, f32: Float32Array, u32: Uint32Array): number {
  f32[0] = value;
  const bits = u32[0]!;
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

function bf16Tensor(name: string, shape: number[], fill: () => number): TensorToWrite {
  const count = shape.reduce((a, b) => a * b, 1);
  const data = new Uint8Array(count * 2);
  const view = new DataView(data.buffer);
  const f32 = new Float32Array(1);
  const u32 = new Uint32Array(f32.buffer);
  for (let i = 0; i < count; i++) view.setUint16(i * 2, toBf16(fill(), f32, u32), true);
  return { name, dtype: 'BF16', shape, data };
}

export async function makeExample(outDir: string): Promise<void> {
  const random = prng(SEED);
  // Irwin-Hall: the sum of 4 uniforms is close to normal; scaled to initializer_range.
  const normal = (): number => (random() + random() + random() + random() - 2) * Math.sqrt(3) * CONFIG.initializer_range;
  const one = (): number => 1;
  const h = CONFIG.hidden_size, i = CONFIG.intermediate_size, v = CONFIG.vocab_size;
  const q = CONFIG.num_attention_heads * CONFIG.head_dim, kv = CONFIG.num_key_value_heads * CONFIG.head_dim;

  const shards: TensorToWrite[][] = [[], []];
  shards[0]!.push(bf16Tensor('model.embed_tokens.weight', [v, h], normal));
  for (let layer = 0; layer < CONFIG.num_hidden_layers; layer++) {
    const p = `model.layers.${layer}`;
    shards[layer < SPLIT_LAYER ? 0 : 1]!.push(
      bf16Tensor(`${p}.input_layernorm.weight`, [h], one),
      bf16Tensor(`${p}.self_attn.q_proj.weight`, [q, h], normal),
      bf16Tensor(`${p}.self_attn.k_proj.weight`, [kv, h], normal),
      bf16Tensor(`${p}.self_attn.v_proj.weight`, [kv, h], normal),
      bf16Tensor(`${p}.self_attn.o_proj.weight`, [h, q], normal),
      bf16Tensor(`${p}.post_attention_layernorm.weight`, [h], one),
      bf16Tensor(`${p}.mlp.gate_proj.weight`, [i, h], normal),
      bf16Tensor(`${p}.mlp.up_proj.weight`, [i, h], normal),
      bf16Tensor(`${p}.mlp.down_proj.weight`, [h, i], normal),
    );
  }
  shards[1]!.push(bf16Tensor('model.norm.weight', [h], one), bf16Tensor('lm_head.weight', [v, h], normal));

  await mkdir(outDir, { recursive: true });
  const weightMap: Record<string, string> = {};
  let totalSize = 0;
  for (const [n, tensors] of shards.entries()) {
    const file = `model-0000${n + 1}-of-0000${shards.length}.safetensors`;
    // safetensors' save_file orders by dtype, then name; all of these are BF16.
    tensors.sort((a, b) => (a.name < b.name ? -1 : 1));
    await writeSafetensors(join(outDir, file), tensors, { format: 'pt' });
    for (const t of tensors) {
      weightMap[t.name] = file;
      totalSize += t.data!.byteLength;
    }
  }
  const pretty = (value: unknown): string => `${JSON.stringify(JSON.parse(canonicalJson(value)), null, 2)}\n`;
  await writeFile(join(outDir, 'model.safetensors.index.json'), pretty({ metadata: { total_size: totalSize }, weight_map: weightMap }));
  await writeFile(join(outDir, 'config.json'), pretty(CONFIG));
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const outDir = process.argv[2] ?? fileURLToPath(new URL('../../examples/tiny-llama', import.meta.url));
  await makeExample(outDir);
  console.log(`wrote ${outDir}`);
}
