// KV heads fewer than the tp size: each KV head is replicated on tp / kvHeads consecutive
// ranks, as vLLM's QKVParallelLinear does (rank r holds KV head r / (tp / kvHeads)).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { ShardingError } from '../../src/errors.js';
import { executePlan, makeTempDir, rejectsWith, removeDir, writeArchCheckpoint, type FixtureTensor } from '../helpers/checkpoints.js';

const HEAD_DIM = 8, HIDDEN = 64, ELT = 2;

/** Rows [head * HEAD_DIM, (head + 1) * HEAD_DIM) of a [kvHeads * HEAD_DIM, HIDDEN] BF16 matrix. */
const headRows = (t: FixtureTensor, head: number): Buffer => Buffer.from(t.data.subarray(head * HEAD_DIM * HIDDEN * ELT, (head + 1) * HEAD_DIM * HIDDEN * ELT));

for (const [kvHeads, tp] of [[2, 4], [2, 8], [1, 4], [4, 8]] as const) {
  test(`${kvHeads} KV heads over tp ${tp}: rank r holds head r / ${tp / kvHeads}`, async () => {
    const dir = makeTempDir('kv');
    try {
      const tensors = await writeArchCheckpoint(dir, 'Qwen2ForCausalLM', { kvHeads, layers: 1 });
      const plan = await planCheckpoint(dir, { tpSize: tp });
      const k = tensors.find((t) => t.name === 'model.layers.0.self_attn.k_proj.weight')!;
      const vBias = tensors.find((t) => t.name === 'model.layers.0.self_attn.v_proj.bias')!;
      for (const rank of plan.ranks) {
        const head = Math.floor(rank.tpRank / (tp / kvHeads));
        const [arena] = await executePlan(rank);
        const entry = rank.tensors.find((e) => e.name === k.name)!;
        assert.equal(entry.shape, [HEAD_DIM, HIDDEN]);
        assert.ok(arena!.subarray(entry.offset, entry.offset + entry.bytes).equals(headRows(k, head)), `rank ${rank.tpRank} should hold KV head ${head}`);
        const bias = rank.tensors.find((e) => e.name === vBias.name)!;
        assert.ok(arena!.subarray(bias.offset, bias.offset + bias.bytes).equals(Buffer.from(vBias.data.subarray(head * HEAD_DIM * ELT, (head + 1) * HEAD_DIM * ELT))));
        assert.equal(entry.rule, { kind: 'split', dim: 0, kvHeads });
      }
    } finally {
      removeDir(dir);
    }
  });
}

test('Phi-3 fused qkv_proj replicates its k and v parts and splits q', async () => {
  const dir = makeTempDir('kv-phi3');
  try {
    const tensors = await writeArchCheckpoint(dir, 'Phi3ForCausalLM', { kvHeads: 2, layers: 1 });
    const plan = await planCheckpoint(dir, { tpSize: 4 });
    const qkv = tensors.find((t) => t.name.endsWith('qkv_proj.weight'))!;
    const rowBytes = HIDDEN * ELT;
    const rows = (from: number, count: number): Buffer => Buffer.from(qkv.data.subarray(from * rowBytes, (from + count) * rowBytes));
    for (const rank of plan.ranks) {
      const [arena] = await executePlan(rank);
      const e = rank.tensors.find((x) => x.name === qkv.name)!;
      const head = Math.floor(rank.tpRank / 2);
      // q: 64 rows, 16 per rank; k and v: 2 heads of 8 rows each, after the 64 q rows.
      const want = Buffer.concat([rows(rank.tpRank * 16, 16), rows(64 + head * 8, 8), rows(80 + head * 8, 8)]);
      assert.ok(arena!.subarray(e.offset, e.offset + e.bytes).equals(want), `rank ${rank.tpRank}`);
    }
  } finally {
    removeDir(dir);
  }
});

test('KV heads and tp that divide neither way: E_SHARD_KV_HEADS before anything loads', async () => {
  const dir = makeTempDir('kv-bad');
  try {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { heads: 12, kvHeads: 3, hidden: 96, layers: 1 });
    await rejectsWith(() => planCheckpoint(dir, { tpSize: 2 }), ShardingError, 'E_SHARD_KV_HEADS', 'num_key_value_heads 3', 'tp size 2');
    await rejectsWith(() => planCheckpoint(dir, { tpSize: 4 }), ShardingError, 'E_SHARD_KV_HEADS', 'num_key_value_heads 3', 'tp size 4');
  } finally {
    removeDir(dir);
  }
});

test('attention heads not divisible by tp: E_SHARD_HEADS even when the bytes would divide', async () => {
  const dir = makeTempDir('heads-bad');
  try {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 1 });
    // q_proj has 64 rows, divisible by 16, but 8 heads cannot be spread over 16 ranks.
    await rejectsWith(() => planCheckpoint(dir, { tpSize: 16 }), ShardingError, 'E_SHARD_HEADS', 'num_attention_heads 8', 'tp size 16');
  } finally {
    removeDir(dir);
  }
});

test.run();
