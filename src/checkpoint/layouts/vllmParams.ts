// The `vllm` layout: which checkpoint tensors make each of vLLM's model parameters, by the names
// `model.named_parameters()` gives after vLLM's weight loaders ran (docs/sharding.md, "The vllm
// layout"). A parameter is its members' rank pieces back to back, in member order: that is what
// QKVParallelLinear (q, k, v), MergedColumnParallelLinear (gate, up) and FusedMoE (w13_weight:
// per expert gate then up; w2_weight: per expert down) hold, since each loader copies a
// member's shard into consecutive rows of the parameter. Vocab padding rows come from the
// checkpoint rule (padTo) and follow the embedding's real rows.
//
// The tables are closed: a tensor no mapping names, an architecture without a table, or a
// fused parameter missing a member is an error at planning time, never a guess.

import { ShardingError } from '../../errors.js';
import type { EngineLayout, EngineParam } from './engineLayout.js';

interface Mapping {
  /** Named groups: `slot` picks the member's place in a fused parameter, `expert` its expert. */
  pattern: RegExp;
  /** Replacement producing the engine's parameter name; null: the engine does not load it. */
  to: string | null;
  /** Slot values in stacking order; absent: a one-member parameter. */
  slots?: readonly string[];
  /** A linear layer's weight: its quantization scales (SCALES) make parameters alongside. */
  linear?: boolean;
}

const LAYER = String.raw`model\.layers\.\d+\.`;
const map = (pattern: string, to: string | null, slots?: readonly string[], linear = false): Mapping => ({ pattern: new RegExp(`^${pattern}$`), to, slots, linear });
const same = (pattern: string, linear = false): Mapping => map(pattern, '$&', undefined, linear);

const EMBEDDINGS = [same(String.raw`model\.embed_tokens\.weight`), same(String.raw`lm_head\.weight`), same(String.raw`model\.norm\.weight`)];
const NORMS = same(`${LAYER}(input_layernorm|post_attention_layernorm)\\.weight`);
const qkv = (suffixes: string): Mapping => map(`(?<pre>${LAYER}self_attn\\.)(?<slot>[qkv])_proj\\.(?<kind>${suffixes})`, '$<pre>qkv_proj.$<kind>', ['q', 'k', 'v'], true);
const gateUp = (suffixes: string): Mapping => map(`(?<pre>${LAYER}mlp\\.)(?<slot>gate|up)_proj\\.(?<kind>${suffixes})`, '$<pre>gate_up_proj.$<kind>', ['gate', 'up'], true);
const oProj = (suffixes: string): Mapping => same(`${LAYER}self_attn\\.o_proj\\.(${suffixes})`, true);
const down = (suffixes: string): Mapping => same(`${LAYER}mlp\\.down_proj\\.(${suffixes})`, true);
// vLLM's Llama-style load_weights skips these buffers some old checkpoints carry.
const ROTARY = map(String.raw`.*\.rotary_emb\.(inv_freq|cos_cached|sin_cached)`, null);
const QK_NORM = same(`${LAYER}self_attn\\.[qk]_norm\\.weight`);
/** FusedMoE: `prefix` is the MoE block's path, `w1|w3|w2` the checkpoint's member names. */
const fusedMoe = (block: string, gateUpNames: readonly [string, string], downName: string): Mapping[] => [
  map(`(?<pre>${LAYER}${block}\\.experts\\.)(?<expert>\\d+)\\.(?<slot>${gateUpNames.join('|')})\\.weight`, '$<pre>w13_weight', gateUpNames, true),
  map(`(?<pre>${LAYER}${block}\\.experts\\.)(?<expert>\\d+)\\.(?<slot>${downName})\\.weight`, '$<pre>w2_weight', [downName], true),
];

// Llama's attention and MLP take biases when config.attention_bias / mlp_bias are set.
const LLAMA = [...EMBEDDINGS, NORMS, ROTARY, qkv('weight|bias'), oProj('weight|bias'), gateUp('weight|bias'), down('weight|bias')];
const QWEN2 = [...EMBEDDINGS, NORMS, ROTARY, qkv('weight|bias'), oProj('weight'), gateUp('weight'), down('weight')];
const QWEN3_ATTENTION = [qkv('weight|bias'), oProj('weight'), QK_NORM];
const QWEN3 = [...EMBEDDINGS, NORMS, ROTARY, ...QWEN3_ATTENTION, gateUp('weight'), down('weight')];
// Layers listed in mlp_only_layers keep a dense MLP.
const QWEN3_MOE = [...EMBEDDINGS, NORMS, ROTARY, ...QWEN3_ATTENTION, same(`${LAYER}mlp\\.gate\\.weight`), ...fusedMoe('mlp', ['gate_proj', 'up_proj'], 'down_proj'), gateUp('weight'), down('weight')];
const MIXTRAL = [...EMBEDDINGS, NORMS, ROTARY, qkv('weight'), oProj('weight'), same(`${LAYER}block_sparse_moe\\.gate\\.weight`), ...fusedMoe('block_sparse_moe', ['w1', 'w3'], 'w2')];
const GEMMA2 = [...EMBEDDINGS, same(`${LAYER}(pre|post)_feedforward_layernorm\\.weight`), NORMS, qkv('weight'), oProj('weight'), gateUp('weight'), down('weight')];
// Phi-3 checkpoints hold qkv_proj and gate_up_proj already fused, in vLLM's order.
const PHI3 = [...EMBEDDINGS, NORMS, ROTARY, same(`${LAYER}self_attn\\.(qkv_proj|o_proj)\\.weight`, true), same(`${LAYER}mlp\\.(gate_up_proj|down_proj)\\.weight`, true)];

const TABLES: Readonly<Record<string, readonly Mapping[]>> = {
  LlamaForCausalLM: LLAMA,
  MistralForCausalLM: LLAMA,
  Qwen2ForCausalLM: QWEN2,
  Qwen3ForCausalLM: QWEN3,
  Qwen3MoeForCausalLM: QWEN3_MOE,
  MixtralForCausalLM: MIXTRAL,
  Gemma2ForCausalLM: GEMMA2,
  Phi3ForCausalLM: PHI3,
};

/**
 * Quantization side tensors named after the weight they scale, which vLLM's quantization methods
 * register on the same layer and fill through the same weight loader:
 * - `weight_scale_inv`, block FP8 (BlockQuantScaleParameter): stacks like its weight, offsets in blocks;
 * - `weight_scale`, per-tensor FP8 (PerTensorScaleParameter; FusedMoE's `w13_weight_scale` [E, 2]
 *   and `w2_weight_scale` [E]): one scalar per member, in member order;
 * - `input_scale`, static activation scales of a linear layer: one scalar per member. FusedMoE
 *   keeps one per expert for w1 and w3 together, which no stacking of checkpoint tensors makes.
 */
const SCALES: readonly { suffix: string; moe: boolean }[] = [
  { suffix: 'weight_scale_inv', moe: true },
  { suffix: 'weight_scale', moe: true },
  { suffix: 'input_scale', moe: false },
];

export const VLLM_ARCHITECTURES: readonly string[] = Object.keys(TABLES);

interface Slotted {
  param: string;
  slot: number;
  expert: number;
  slots: number;
  name: string;
}

/**
 * The engine parameters of a checkpoint whose loaded tensors are `names` (tied aliases already
 * removed), in the order of their first member in `names`.
 */
export function vllmParams(architecture: string, names: readonly string[]): EngineParam[] {
  const table = Object.hasOwn(TABLES, architecture) ? TABLES[architecture]! : null;
  if (!table) {
    throw new ShardingError('E_LAYOUT_ARCHITECTURE', `the vllm layout does not know architecture "${architecture}" (it knows ${VLLM_ARCHITECTURES.join(', ')}); serve the checkpoint layout only (leave vllm out of --layouts)`, { architecture, layout: 'vllm' });
  }
  const groups = new Map<string, Slotted[]>();
  const unknown: string[] = [];
  for (const name of names) {
    const scale = SCALES.find((sc) => name.endsWith(`.${sc.suffix}`));
    const weightName = scale ? `${name.slice(0, -scale.suffix.length)}weight` : name;
    const mapping = table.find((m) => m.pattern.test(weightName));
    if (!mapping || (scale && !mapping.linear)) {
      unknown.push(name);
      continue;
    }
    if (mapping.to === null) continue;
    const found = weightName.match(mapping.pattern)!;
    const expert = found.groups?.expert === undefined ? -1 : Number(found.groups.expert);
    if (scale && expert >= 0 && !scale.moe) {
      unknown.push(name);
      continue;
    }
    // `x.weight` -> `x.weight_scale`, `x.input_scale`; FusedMoE's `w13_weight` -> `w13_weight_scale`.
    const weightParam = weightName.replace(mapping.pattern, mapping.to);
    const param = !scale ? weightParam : scale.suffix === 'input_scale' ? weightParam.replace(/weight$/, scale.suffix) : `${weightParam}${scale.suffix.slice('weight'.length)}`;
    const slots = mapping.slots ?? [''];
    const slot = mapping.slots ? slots.indexOf(found.groups!.slot!) : 0;
    const list = groups.get(param) ?? [];
    list.push({ param, slot, expert, slots: slots.length, name });
    groups.set(param, list);
  }
  if (unknown.length) {
    const listed = unknown.slice(0, 20).join(', ');
    throw new ShardingError('E_LAYOUT_UNKNOWN_TENSOR', `the vllm layout of ${architecture} has no parameter for ${unknown.length} checkpoint tensor(s): ${listed}${unknown.length > 20 ? `, ... and ${unknown.length - 20} more` : ''}; vLLM would not load them either, or weightd does not know this variant yet. Serve the checkpoint layout only`, { architecture, tensors: unknown.slice(0, 20), count: unknown.length, layout: 'vllm' });
  }
  return [...groups.values()].map((members) => orderMembers(architecture, members));
}

/** Members in stacking order (expert-major, then slot), refusing a parameter with holes. */
function orderMembers(architecture: string, members: Slotted[]): EngineParam {
  const { param, slots } = members[0]!;
  const moe = members[0]!.expert >= 0;
  const experts = moe ? Math.max(...members.map((m) => m.expert)) + 1 : 1;
  const bySlot = new Array<string | undefined>(experts * slots);
  for (const m of members) bySlot[(moe ? m.expert : 0) * slots + m.slot] = m.name;
  const missing = bySlot.findIndex((n) => n === undefined);
  if (missing >= 0 || members.length !== bySlot.length) {
    throw new ShardingError('E_LAYOUT_INCOMPLETE', `the vllm parameter "${param}" of ${architecture} needs ${bySlot.length} checkpoint tensors (${moe ? `${experts} experts x ` : ''}${slots} part(s)) but the checkpoint has ${members.length}${missing >= 0 ? `; part ${missing} is missing` : ''}: ${members.map((m) => m.name).join(', ')}; the checkpoint is incomplete`, { param, architecture, layout: 'vllm' });
  }
  return { name: param, members: bySlot as string[], experts: moe ? experts : 0 };
}

export const vllmLayout: EngineLayout = { name: 'vllm', engine: 'vLLM', params: vllmParams };
