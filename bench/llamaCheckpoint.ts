// The benchmarks' checkpoint: Llama-shaped random bf16 tensors in shards of about 1 GiB, as
// save_pretrained writes them, with as many layers as fit in the size asked for. A directory that
// already holds one (its index file) is reused as it is.
import { randomFillSync } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { writeSafetensors, type TensorToWrite } from '../src/checkpoint/writeSafetensors.js';

export interface LlamaShape {
  hidden: number;
  intermediate: number;
  heads: number;
  kvHeads: number;
  vocab: number;
}

/** What the host benchmarks have used since 2026-11-30: small enough for a 2-core VM. */
export const SMALL_LLAMA: LlamaShape = { hidden: 2048, intermediate: 5632, heads: 16, kvHeads: 4, vocab: 32000 };
/** Llama-3-8B's layer (hidden 4096, 14336, 32 heads, 8 KV heads), with Llama 2's vocabulary. */
export const LLAMA_8B_LAYER: LlamaShape = { hidden: 4096, intermediate: 14336, heads: 32, kvHeads: 8, vocab: 32000 };

/** Writes (or finds) the checkpoint in `dir`; returns its tensor bytes. */
export async function writeLlamaCheckpoint(dir: string, gib: number, shape: LlamaShape = SMALL_LLAMA): Promise<number> {
  const index = join(dir, 'model.safetensors.index.json');
  if (existsSync(index)) return (JSON.parse(readFileSync(index, 'utf8')) as { metadata: { total_size: number } }).metadata.total_size;
  mkdirSync(dir, { recursive: true });
  const { hidden: h, intermediate: inter, vocab } = shape;
  const kv = (h / shape.heads) * shape.kvHeads;
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
  const bytesOf = (s: number[]) => s.reduce((a, b) => a * b, 1) * 2;
  const layerBytes = layerTensors(0).reduce((a, [, s]) => a + bytesOf(s), 0);
  const layers = Math.max(2, Math.round((gib * 2 ** 30 - 2 * vocab * h * 2) / layerBytes));
  const all: Array<[string, number[]]> = [['model.embed_tokens.weight', [vocab, h]], ['model.norm.weight', [h]], ['lm_head.weight', [vocab, h]]];
  for (let l = 0; l < layers; l++) all.push(...layerTensors(l));
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
    const tensors: TensorToWrite[] = shards[i]!.map(([name, s]) => {
      weightMap[name] = file;
      total += bytesOf(s);
      return { name, dtype: 'BF16', shape: s, data: randomFillSync(new Uint8Array(bytesOf(s))) };
    });
    await writeSafetensors(join(dir, file), tensors);
  }
  writeFileSync(index, JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'], hidden_size: h, intermediate_size: inter, num_attention_heads: shape.heads,
    num_key_value_heads: shape.kvHeads, num_hidden_layers: layers, vocab_size: vocab, tie_word_embeddings: false, torch_dtype: 'bfloat16',
  }));
  return total;
}
