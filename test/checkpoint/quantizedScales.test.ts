// Quantization scales follow their weight's rule when their shape can be cut the same way, and
// are replicated otherwise; none of them stops planning.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { executePlan, expectedPiece, fixtureTensor, makeTempDir, removeDir, writeCheckpoint, type Expect, type FixtureTensor } from '../helpers/checkpoints.js';

const CONFIG = { architectures: ['LlamaForCausalLM'], num_attention_heads: 8, num_key_value_heads: 4, head_dim: 8, hidden_size: 64, tie_word_embeddings: false };
const BLOCK = 16;

/** An fp8 weight with block-wise weight_scale_inv (DeepSeek/Qwen3-FP8 style) and what each should become. */
function fp8(name: string, shape: [number, number], weight: Expect, scale: Expect): FixtureTensor[] {
  return [
    fixtureTensor(`${name}.weight`, shape, weight, 'F8_E4M3'),
    fixtureTensor(`${name}.weight_scale_inv`, [shape[0] / BLOCK, shape[1] / BLOCK], scale, 'F32'),
  ];
}

test('block scales: split with their weight when blocks divide, replicated otherwise', async () => {
  const dir = makeTempDir('fp8');
  try {
    const p = 'model.layers.0';
    const tensors = [
      fixtureTensor('model.embed_tokens.weight', [256, 64], { dim: 0 }),
      // q: 64 rows = 4 scale rows, split by 2. k: 32 rows = 2 scale rows for 4 KV heads: a head
      // is half a block, but at tp 2 a rank holds 2 heads, one whole block, so the scale follows.
      ...fp8(`${p}.self_attn.q_proj`, [64, 64], { dim: 0 }, { dim: 0 }),
      ...fp8(`${p}.self_attn.k_proj`, [32, 64], { dim: 0, parts: [{ size: 32, kvHeads: 4 }] }, { dim: 0, parts: [{ size: 2, kvHeads: 4 }] }),
      ...fp8(`${p}.self_attn.o_proj`, [64, 64], { dim: 1 }, { dim: 1 }),
      ...fp8(`${p}.mlp.gate_proj`, [128, 64], { dim: 0 }, { dim: 0 }),
      ...fp8(`${p}.mlp.down_proj`, [64, 128], { dim: 1 }, { dim: 1 }),
      // Per-tensor and activation scales are scalars.
      fixtureTensor(`${p}.mlp.up_proj.weight`, [128, 64], { dim: 0 }, 'F8_E4M3'),
      fixtureTensor(`${p}.mlp.up_proj.weight_scale`, [], 'full', 'F32'),
      fixtureTensor(`${p}.mlp.up_proj.input_scale`, [], 'full', 'F32'),
      // Per-output-channel scales: split with a column weight; with a row weight, dim 1 is 1.
      fixtureTensor(`${p}.self_attn.v_proj.weight`, [32, 64], { dim: 0, parts: [{ size: 32, kvHeads: 4 }] }, 'F8_E4M3'),
      fixtureTensor(`${p}.self_attn.v_proj.weight_scale`, [32, 1], { dim: 0, parts: [{ size: 32, kvHeads: 4 }] }, 'F32'),
      // A scale whose weight is not in the checkpoint still plans (replicated).
      fixtureTensor(`${p}.self_attn.kv_cache.weight_scale`, [1], 'full', 'F32'),
      fixtureTensor('model.norm.weight', [64], 'full'),
      fixtureTensor('lm_head.weight', [256, 64], { dim: 0 }),
    ];
    await writeCheckpoint(dir, CONFIG, tensors);
    const plan = await planCheckpoint(dir, { tpSize: 2 });
    for (const rank of plan.ranks) {
      const [arena] = await executePlan(rank);
      for (const t of tensors) {
        const e = rank.tensors.find((x) => x.name === t.name)!;
        const want = expectedPiece(t, 2, rank.tpRank);
        assert.equal(e.shape, want.shape, t.name);
        assert.ok(arena!.subarray(e.offset, e.offset + e.bytes).equals(want.data), `${t.name} rank ${rank.tpRank}`);
      }
    }
    // At tp 8 q's 4 scale rows no longer divide: replicated, and planning still succeeds.
    const tp8 = await planCheckpoint(dir, { tpSize: 8 });
    assert.equal(tp8.ranks[3]!.tensors.find((t) => t.name === `${p}.self_attn.q_proj.weight_scale_inv`)!.rule, { kind: 'replicated' });
    // At tp 4 a rank holds one KV head, half a block: k's scale no longer follows either.
    const tp4 = await planCheckpoint(dir, { tpSize: 4 });
    assert.equal(tp4.ranks[1]!.tensors.find((t) => t.name === `${p}.self_attn.k_proj.weight_scale_inv`)!.rule, { kind: 'replicated' });
  } finally {
    removeDir(dir);
  }
});

test('a fused weight (Phi-3 gate_up_proj) rescales its parts onto the block scale', async () => {
  const dir = makeTempDir('fp8-fused');
  try {
    const p = 'model.layers.0';
    const tensors = [
      fixtureTensor('model.embed_tokens.weight', [256, 64], { dim: 0 }),
      fixtureTensor(`${p}.mlp.gate_up_proj.weight`, [256, 64], { dim: 0, parts: [{ size: 128 }, { size: 128 }] }, 'F8_E4M3'),
      fixtureTensor(`${p}.mlp.gate_up_proj.weight_scale_inv`, [16, 4], { dim: 0, parts: [{ size: 8 }, { size: 8 }] }, 'F32'),
      fixtureTensor('lm_head.weight', [256, 64], { dim: 0 }),
    ];
    await writeCheckpoint(dir, { ...CONFIG, architectures: ['Phi3ForCausalLM'] }, tensors, 1);
    const plan = await planCheckpoint(dir, { tpSize: 4 });
    for (const rank of plan.ranks) {
      const [arena] = await executePlan(rank);
      for (const t of tensors) {
        const e = rank.tensors.find((x) => x.name === t.name)!;
        assert.ok(arena!.subarray(e.offset, e.offset + e.bytes).equals(expectedPiece(t, 4, rank.tpRank).data), `${t.name} rank ${rank.tpRank}`);
      }
    }
    assert.equal(plan.ranks[0]!.tensors.find((t) => t.name.endsWith('weight_scale_inv'))!.rule, { kind: 'fused', dim: 0, parts: [8, 8] });
  } finally {
    removeDir(dir);
  }
});

test.run();
