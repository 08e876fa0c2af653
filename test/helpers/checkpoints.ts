// Test fixtures for the checkpoint layer: small checkpoints with each architecture's real tensor
// names and shapes, a reference executor that runs a load plan with plain fs reads, and an
// oracle that slices the original tensors by element index, independently of the planner.

import { mkdtempSync, rmSync } from 'node:fs';
import { open, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as assert from 'uvu/assert';
import { bytesForElements, type SafetensorsDtype } from '../../src/checkpoint/dtypes.js';
import type { RankPlan } from '../../src/checkpoint/types.js';
import { writeSafetensors } from '../../src/checkpoint/writeSafetensors.js';
import { WeightdError } from '../../src/errors.js';

export function makeTempDir(tag: string): string {
  return mkdtempSync(join(tmpdir(), `weightd-${tag}-`));
}

export function removeDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}

/** Deterministic bytes (xorshift32), so every run of a test sees the same tensors. */
export function randomBytes(seed: number, n: number): Uint8Array {
  const out = new Uint8Array(n);
  let x = (seed >>> 0) || 0x9e3779b9;
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    out[i] = x & 0xff;
  }
  return out;
}

function seedOf(name: string): number {
  let h = 2166136261;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 16777619);
  return h >>> 0;
}

/**
 * What a rank must hold, stated from the architecture's semantics (vLLM's layers), not from the
 * planner's rule table: 'full', or a split along `dim` of parts that are each cut into tp
 * pieces (KV parts with fewer heads than tp: rank r holds head r / (tp / kvHeads)).
 */
export type Expect = 'full' | { dim: number; parts?: Array<{ size: number; kvHeads?: number }> };

export interface FixtureTensor {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  data: Uint8Array;
  expect: Expect;
}

export function fixtureTensor(name: string, shape: number[], expect: Expect, dtype: SafetensorsDtype = 'BF16'): FixtureTensor {
  const bytes = bytesForElements(dtype, shape.reduce((a, b) => a * b, 1));
  if (bytes === null) throw new Error(`fixture ${name}: shape does not fill whole bytes`);
  return { name, dtype, shape, data: randomBytes(seedOf(name), bytes), expect };
}

export interface ArchOptions {
  hidden?: number;
  heads?: number;
  kvHeads?: number;
  headDim?: number;
  intermediate?: number;
  vocab?: number;
  layers?: number;
  experts?: number;
  /** Shard count; 1 writes a single model.safetensors with no index. */
  shards?: number;
  config?: Record<string, unknown>;
}

export const ARCHITECTURES = [
  'LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM', 'Qwen2MoeForCausalLM',
  'Qwen3MoeForCausalLM', 'MixtralForCausalLM', 'GemmaForCausalLM', 'Gemma2ForCausalLM', 'Phi3ForCausalLM',
] as const;

/** Tensors of one architecture, with the names its Hugging Face checkpoints use. */
export function architectureTensors(arch: string, o: Required<Omit<ArchOptions, 'shards' | 'config'>>): FixtureTensor[] {
  const { hidden: h, heads, kvHeads: kv, headDim: hd, intermediate: inter, vocab, layers, experts } = o;
  const q = heads * hd, k = kv * hd;
  const rows: Expect = { dim: 0 }, cols: Expect = { dim: 1 };
  const kvRows: Expect = { dim: 0, parts: [{ size: k, kvHeads: kv }] };
  const isGemma = arch.startsWith('Gemma');
  // Gemma keeps its norms in fp32 here: mixed dtypes and 4-byte-element alignment gaps.
  const normDtype: SafetensorsDtype = isGemma ? 'F32' : 'BF16';
  const out: FixtureTensor[] = [fixtureTensor('model.embed_tokens.weight', [vocab, h], rows)];
  for (let l = 0; l < layers; l++) {
    const p = `model.layers.${l}`;
    const t = (name: string, shape: number[], expect: Expect, dtype: SafetensorsDtype = 'BF16'): void => {
      out.push(fixtureTensor(`${p}.${name}`, shape, expect, dtype));
    };
    t('input_layernorm.weight', [h], 'full', normDtype);
    t('post_attention_layernorm.weight', [h], 'full', normDtype);
    if (arch === 'Phi3ForCausalLM') {
      t('self_attn.qkv_proj.weight', [q + 2 * k, h], { dim: 0, parts: [{ size: q }, { size: k, kvHeads: kv }, { size: k, kvHeads: kv }] });
      t('self_attn.o_proj.weight', [h, q], cols);
      t('mlp.gate_up_proj.weight', [2 * inter, h], { dim: 0, parts: [{ size: inter }, { size: inter }] });
      t('mlp.down_proj.weight', [h, inter], cols);
      continue;
    }
    t('self_attn.q_proj.weight', [q, h], rows);
    t('self_attn.k_proj.weight', [k, h], kvRows);
    t('self_attn.v_proj.weight', [k, h], kvRows);
    t('self_attn.o_proj.weight', [h, q], cols);
    if (arch === 'Qwen2ForCausalLM' || arch === 'Qwen2MoeForCausalLM') {
      t('self_attn.q_proj.bias', [q], rows);
      t('self_attn.k_proj.bias', [k], kvRows);
      t('self_attn.v_proj.bias', [k], kvRows);
    }
    if (arch === 'Qwen3ForCausalLM' || arch === 'Qwen3MoeForCausalLM') {
      t('self_attn.q_norm.weight', [hd], 'full');
      t('self_attn.k_norm.weight', [hd], 'full');
    }
    if (arch === 'Gemma2ForCausalLM') {
      t('pre_feedforward_layernorm.weight', [h], 'full', normDtype);
      t('post_feedforward_layernorm.weight', [h], 'full', normDtype);
    }
    if (arch === 'Qwen2MoeForCausalLM' || arch === 'Qwen3MoeForCausalLM') {
      t('mlp.gate.weight', [experts, h], 'full');
      for (let e = 0; e < experts; e++) {
        t(`mlp.experts.${e}.gate_proj.weight`, [inter, h], rows);
        t(`mlp.experts.${e}.up_proj.weight`, [inter, h], rows);
        t(`mlp.experts.${e}.down_proj.weight`, [h, inter], cols);
      }
      if (arch === 'Qwen2MoeForCausalLM') {
        t('mlp.shared_expert.gate_proj.weight', [inter, h], rows);
        t('mlp.shared_expert.up_proj.weight', [inter, h], rows);
        t('mlp.shared_expert.down_proj.weight', [h, inter], cols);
        t('mlp.shared_expert_gate.weight', [1, h], 'full');
      }
    } else if (arch === 'MixtralForCausalLM') {
      t('block_sparse_moe.gate.weight', [experts, h], 'full');
      for (let e = 0; e < experts; e++) {
        t(`block_sparse_moe.experts.${e}.w1.weight`, [inter, h], rows);
        t(`block_sparse_moe.experts.${e}.w2.weight`, [h, inter], cols);
        t(`block_sparse_moe.experts.${e}.w3.weight`, [inter, h], rows);
      }
    } else {
      t('mlp.gate_proj.weight', [inter, h], rows);
      t('mlp.up_proj.weight', [inter, h], rows);
      t('mlp.down_proj.weight', [h, inter], cols);
    }
  }
  out.push(fixtureTensor('model.norm.weight', [h], 'full', normDtype));
  // Gemma ties lm_head to the embedding and its checkpoints do not store it.
  if (!isGemma) out.push(fixtureTensor('lm_head.weight', [vocab, h], rows));
  return out;
}

const DEFAULTS: Required<Omit<ArchOptions, 'shards' | 'config'>> = {
  hidden: 64, heads: 8, kvHeads: 4, headDim: 8, intermediate: 128, vocab: 256, layers: 2, experts: 3,
};

/** Writes config.json and the tensors, sharded like a Hugging Face export. */
export async function writeCheckpoint(dir: string, config: Record<string, unknown>, tensors: FixtureTensor[], shards = 2): Promise<void> {
  await writeFile(join(dir, 'config.json'), JSON.stringify(config, null, 2));
  if (shards === 1) {
    await writeSafetensors(join(dir, 'model.safetensors'), tensors, { format: 'pt' });
    return;
  }
  const weightMap: Record<string, string> = {};
  const per = Math.ceil(tensors.length / shards);
  for (let s = 0; s < shards; s++) {
    const file = `model-${String(s + 1).padStart(5, '0')}-of-${String(shards).padStart(5, '0')}.safetensors`;
    const part = tensors.slice(s * per, (s + 1) * per);
    await writeSafetensors(join(dir, file), part, { format: 'pt' });
    for (const t of part) weightMap[t.name] = file;
  }
  await writeFile(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: {}, weight_map: weightMap }, null, 2));
}

export async function writeArchCheckpoint(dir: string, arch: string, options: ArchOptions = {}): Promise<FixtureTensor[]> {
  const o = { ...DEFAULTS, ...options };
  const tensors = architectureTensors(arch, o);
  const config: Record<string, unknown> = {
    architectures: [arch],
    hidden_size: o.hidden,
    num_attention_heads: o.heads,
    num_key_value_heads: o.kvHeads,
    head_dim: o.headDim,
    intermediate_size: o.intermediate,
    vocab_size: o.vocab,
    num_hidden_layers: o.layers,
    tie_word_embeddings: arch.startsWith('Gemma'),
    torch_dtype: 'bfloat16',
    ...options.config,
  };
  await writeCheckpoint(dir, config, tensors, options.shards ?? 2);
  return tensors;
}

/** Runs a rank's copy ops with plain positional reads into host buffers, one per segment. */
export async function executePlan(plan: RankPlan): Promise<Buffer[]> {
  const arenas = plan.segments.map((size) => Buffer.alloc(size));
  const handles = await Promise.all(plan.files.map((f) => open(f, 'r')));
  try {
    for (const op of plan.ops) {
      const arena = arenas[op.segment]!;
      assert.ok(op.dstOffset + op.rows * op.rowBytes <= arena.length, `op writes past segment ${op.segment}`);
      // One read of the op's whole source span, then the rows picked out of it.
      const span = Buffer.alloc((op.rows - 1) * op.srcPitch + op.rowBytes);
      const { bytesRead } = await handles[op.file]!.read(span, 0, span.length, op.srcOffset);
      assert.is(bytesRead, span.length, 'short read: an op reads past the end of its file');
      for (let r = 0; r < op.rows; r++) span.copy(arena, op.dstOffset + r * op.rowBytes, r * op.srcPitch, r * op.srcPitch + op.rowBytes);
    }
  } finally {
    await Promise.all(handles.map((h) => h.close()));
  }
  return arenas;
}

/** The bytes rank `rank` of `tp` must hold, cut from the original tensor element by element. */
export function expectedPiece(t: FixtureTensor, tp: number, rank: number): { shape: number[]; data: Buffer } {
  if (t.expect === 'full') return { shape: t.shape, data: Buffer.from(t.data) };
  const { dim } = t.expect;
  const size = t.shape[dim]!;
  const parts = t.expect.parts ?? [{ size }];
  const ranges: Array<[number, number]> = [];
  let base = 0;
  for (const part of parts) {
    const heads = part.kvHeads;
    if (heads !== undefined && tp > heads) {
      const perHead = part.size / heads;
      const head = Math.floor(rank / (tp / heads));
      ranges.push([base + head * perHead, perHead]);
    } else {
      const chunk = part.size / tp;
      ranges.push([base + rank * chunk, chunk]);
    }
    base += part.size;
  }
  const elt = bytesForElements(t.dtype, 1)!;
  const outer = t.shape.slice(0, dim).reduce((a, b) => a * b, 1);
  const inner = t.shape.slice(dim + 1).reduce((a, b) => a * b, 1);
  const chunks: Buffer[] = [];
  for (let o = 0; o < outer; o++) {
    for (const [start, len] of ranges) {
      for (let i = start; i < start + len; i++) {
        const from = ((o * size + i) * inner) * elt;
        chunks.push(Buffer.from(t.data.subarray(from, from + inner * elt)));
      }
    }
  }
  const shape = t.shape.slice();
  shape[dim] = ranges.reduce((a, [, len]) => a + len, 0);
  return { shape, data: Buffer.concat(chunks) };
}

/** Asserts that an async call fails with this class and code, and that its message names each `mentions`. */
export async function rejectsWith(run: () => Promise<unknown>, cls: new (...args: never[]) => WeightdError, code: string, ...mentions: string[]): Promise<WeightdError> {
  try {
    await run();
  } catch (err) {
    assert.instance(err, cls, `expected ${cls.name} ${code}, got ${String(err)}`);
    const e = err as WeightdError;
    assert.is(e.code, code, `expected code ${code}, got ${e.code}: ${e.message}`);
    for (const m of mentions) assert.ok(e.message.includes(m), `message should mention "${m}": ${e.message}`);
    return e;
  }
  assert.unreachable(`expected ${cls.name} ${code}, but the call succeeded`);
  throw new Error('unreachable');
}

/**
 * Writes a file laid out like safetensors from raw parts, for malformed-file tests: the 8-byte
 * length field (the header's byte length unless `lengthField` overrides it), the header bytes
 * as given, then `data` (bytes, or a count of zero bytes).
 */
export async function writeRawSafetensors(path: string, header: string | Uint8Array, data: number | Uint8Array = 0, lengthField?: bigint): Promise<void> {
  const head = typeof header === 'string' ? Buffer.from(header, 'utf8') : Buffer.from(header);
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64LE(lengthField ?? BigInt(head.length));
  const body = typeof data === 'number' ? Buffer.alloc(data) : Buffer.from(data);
  await writeFile(path, Buffer.concat([prefix, head, body]));
}
