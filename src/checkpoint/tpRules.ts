// Which tensor-parallel rule each checkpoint tensor follows, per architecture family. The
// tables mirror how vLLM's model files build their layers (ColumnParallelLinear,
// RowParallelLinear, QKVParallelLinear, MergedColumnParallelLinear, VocabParallelEmbedding,
// FusedMoE), so a rank's shard here is the shard the engine's own loader would produce.

import { CheckpointError, ShardingError } from '../errors.js';
import type { ModelConfig } from './readModelConfig.js';
import type { ShardRule } from './types.js';

/**
 * A layer's parallel style, turned into a ShardRule once the tensor's shape and the model's
 * head counts are known:
 * - column: split dim 0 (weights and biases); vocab: the same, for embeddings and lm_head;
 * - row: split dim 1 of the weight; its bias is added after the all-reduce, so replicated;
 * - kv: column, over KV heads that are replicated when tp exceeds their number;
 * - qkv: fused [q, k, v] rows (Phi-3); gate_up: fused [gate, up] rows of equal size;
 * - replicated: every rank holds all of it.
 */
export type TpRole = 'column' | 'row' | 'vocab' | 'kv' | 'qkv' | 'gate_up' | 'replicated';

/** A rule from a table or a plan file: a role, or a rule spelled out. First match wins. */
export interface TensorRule {
  pattern: RegExp;
  spec: TpRole | ShardRule;
}

export interface ArchitectureFamily {
  family: string;
  architectures: readonly string[];
  rules: readonly TensorRule[];
  /** HF config default for tie_word_embeddings when config.json leaves it out. */
  tiedByDefault: boolean;
  embedding: string;
  lmHead: string;
}

/** vLLM's DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py). */
export const VOCAB_PADDING = 64;

const rule = (pattern: RegExp, spec: TpRole): TensorRule => ({ pattern, spec });

const EMBEDDINGS = [
  rule(/^model\.embed_tokens\.weight$/, 'vocab'),
  rule(/^lm_head\.weight$/, 'vocab'),
];
const ATTENTION = [
  rule(/\.self_attn\.q_proj\.(weight|bias)$/, 'column'),
  rule(/\.self_attn\.[kv]_proj\.(weight|bias)$/, 'kv'),
  rule(/\.self_attn\.o_proj\.(weight|bias)$/, 'row'),
];
const DENSE_MLP = [
  rule(/\.mlp\.(gate|up)_proj\.(weight|bias)$/, 'column'),
  rule(/\.mlp\.down_proj\.(weight|bias)$/, 'row'),
];
// Every *norm (input_layernorm, post_attention_layernorm, model.norm, Qwen3/Gemma3
// q_norm/k_norm over head_dim, Gemma2 pre/post_feedforward_layernorm) is per-channel and small.
const NORMS = [rule(/norm\.(weight|bias)$/, 'replicated')];
const QWEN_MOE = [
  // FusedMoE without expert parallelism: every rank holds a column/row slice of every expert.
  rule(/\.mlp\.experts\.\d+\.(gate|up)_proj\.weight$/, 'column'),
  rule(/\.mlp\.experts\.\d+\.down_proj\.weight$/, 'row'),
  rule(/\.mlp\.shared_expert\.(gate|up)_proj\.weight$/, 'column'),
  rule(/\.mlp\.shared_expert\.down_proj\.weight$/, 'row'),
  // The router and the shared-expert gate are ReplicatedLinear in vLLM.
  rule(/\.mlp\.gate\.weight$/, 'replicated'),
  rule(/\.mlp\.shared_expert_gate\.weight$/, 'replicated'),
];
const MIXTRAL_MOE = [
  rule(/\.block_sparse_moe\.experts\.\d+\.w[13]\.weight$/, 'column'),
  rule(/\.block_sparse_moe\.experts\.\d+\.w2\.weight$/, 'row'),
  rule(/\.block_sparse_moe\.gate\.weight$/, 'replicated'),
];
const PHI3 = [
  rule(/\.self_attn\.qkv_proj\.weight$/, 'qkv'),
  rule(/\.self_attn\.o_proj\.weight$/, 'row'),
  rule(/\.mlp\.gate_up_proj\.weight$/, 'gate_up'),
  rule(/\.mlp\.down_proj\.weight$/, 'row'),
];

const family = (name: string, architectures: string[], rules: TensorRule[], tiedByDefault = false): ArchitectureFamily => ({
  family: name, architectures, rules, tiedByDefault, embedding: 'model.embed_tokens.weight', lmHead: 'lm_head.weight',
});

export const FAMILIES: readonly ArchitectureFamily[] = [
  family('llama', ['LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'], [...EMBEDDINGS, ...ATTENTION, ...DENSE_MLP, ...NORMS]),
  family('gemma', ['GemmaForCausalLM', 'Gemma2ForCausalLM', 'Gemma3ForCausalLM'], [...EMBEDDINGS, ...ATTENTION, ...DENSE_MLP, ...NORMS], true),
  // Qwen3-MoE can keep dense MLPs in some layers (mlp_only_layers), hence DENSE_MLP too.
  family('qwen-moe', ['Qwen2MoeForCausalLM', 'Qwen3MoeForCausalLM'], [...EMBEDDINGS, ...ATTENTION, ...QWEN_MOE, ...DENSE_MLP, ...NORMS]),
  family('mixtral', ['MixtralForCausalLM'], [...EMBEDDINGS, ...ATTENTION, ...MIXTRAL_MOE, ...NORMS]),
  family('phi3', ['Phi3ForCausalLM'], [...EMBEDDINGS, ...PHI3, ...NORMS]),
];

export function familyOf(architecture: string): ArchitectureFamily | null {
  return FAMILIES.find((f) => f.architectures.includes(architecture)) ?? null;
}

/**
 * Quantization side tensors (fp8 per-tensor/per-channel scales, block-fp8 weight_scale_inv,
 * nvfp4 weight_scale_2, activation input scales) named after the weight they scale.
 */
const SCALE_SUFFIX = /\.(weight_scale_inv|weight_scale_2|weight_scale|weight_global_scale|weight_zero_point|input_scale|input_global_scale)$/;

export function scaledWeightName(name: string): string | null {
  return SCALE_SUFFIX.test(name) ? name.replace(SCALE_SUFFIX, '.weight') : null;
}

function needHeads(config: ModelConfig, tensor: string): { heads: number; kvHeads: number; headDim: number } {
  const { numAttentionHeads: heads, numKeyValueHeads: kvHeads, headDim } = config;
  if (heads === null || kvHeads === null || headDim === null) {
    throw new CheckpointError('E_CKPT_CONFIG', `tensor "${tensor}" is sharded by attention heads, but config.json lacks num_attention_heads (and hidden_size or head_dim); add them`, { tensor });
  }
  return { heads, kvHeads, headDim };
}

/** Turns a role into a concrete rule for a tensor of this shape. */
export function ruleForRole(role: TpRole, name: string, shape: number[], config: ModelConfig): ShardRule {
  switch (role) {
    case 'replicated':
      return { kind: 'replicated' };
    case 'column':
      return { kind: 'split', dim: 0 };
    case 'vocab':
      // Only a vocab that is not a multiple of the padding is padded, so every other model's
      // rule (and fingerprint) stays what it was.
      return (shape[0] ?? 0) % VOCAB_PADDING === 0 ? { kind: 'split', dim: 0 } : { kind: 'split', dim: 0, padTo: VOCAB_PADDING };
    case 'row':
      return shape.length >= 2 ? { kind: 'split', dim: 1 } : { kind: 'replicated' };
    case 'kv':
      return { kind: 'split', dim: 0, kvHeads: needHeads(config, name).kvHeads };
    case 'qkv': {
      const { heads, kvHeads, headDim } = needHeads(config, name);
      const parts = [heads * headDim, kvHeads * headDim, kvHeads * headDim];
      if (parts[0]! + parts[1]! + parts[2]! !== shape[0]) {
        throw new CheckpointError('E_CKPT_FUSED_SHAPE', `tensor "${name}": dim 0 is ${shape[0]}, but config.json's ${heads} heads + 2 x ${kvHeads} KV heads of size ${headDim} make ${parts[0]! + parts[1]! + parts[2]!}; the config does not describe this checkpoint`, { tensor: name });
      }
      return { kind: 'fused', dim: 0, parts, partKvHeads: [0, kvHeads, kvHeads] };
    }
    case 'gate_up': {
      const rows = shape[0] ?? 0;
      if (rows % 2 !== 0) {
        throw new CheckpointError('E_CKPT_FUSED_SHAPE', `tensor "${name}": dim 0 is ${rows}, which cannot hold equal gate and up halves`, { tensor: name });
      }
      return { kind: 'fused', dim: 0, parts: [rows / 2, rows / 2] };
    }
  }
}

/**
 * Attention layers split whole heads. A byte-divisible split can still cut a head in two, so
 * the head counts themselves must divide: q heads by tp, and KV heads by tp or tp by KV heads
 * (the replicated case). Checked once per model, before any tensor.
 */
export function checkHeadCounts(config: ModelConfig, tpSize: number): void {
  const { numAttentionHeads: heads, numKeyValueHeads: kvHeads } = config;
  if (heads !== null && heads % tpSize !== 0) {
    throw new ShardingError('E_SHARD_HEADS', `config.json: num_attention_heads ${heads} is not divisible by tp size ${tpSize}; every rank must hold whole attention heads. Use a tp size that divides ${heads}`, { heads, tpSize });
  }
  if (kvHeads !== null && kvHeads % tpSize !== 0 && tpSize % kvHeads !== 0) {
    throw new ShardingError('E_SHARD_KV_HEADS', `config.json: num_key_value_heads ${kvHeads} and tp size ${tpSize} divide neither way; KV heads are split when tp divides them and replicated when they divide tp. Use a tp size that divides ${kvHeads} or is a multiple of it`, { kvHeads, tpSize });
  }
}
