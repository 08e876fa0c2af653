// The shape of a load plan: 256-byte-aligned offsets in a deterministic order, one segment per
// rank, strided ops with the documented geometry, merged contiguous ops, splits of tensors with
// more than two dims, fused splits below dim 0, and sub-byte dtypes.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { ARENA_ALIGNMENT, planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { ShardingError } from '../../src/errors.js';
import { executePlan, expectedPiece, fixtureTensor, makeTempDir, rejectsWith, removeDir, writeArchCheckpoint, writeCheckpoint, type FixtureTensor } from '../helpers/checkpoints.js';

async function withDir(tag: string, run: (dir: string) => Promise<void>): Promise<void> {
  const dir = makeTempDir(tag);
  try {
    await run(dir);
  } finally {
    removeDir(dir);
  }
}

/** A checkpoint of an unknown architecture whose every tensor is placed by `rules`. */
async function custom(dir: string, tensors: FixtureTensor[], rules: unknown[]): Promise<string> {
  await writeCheckpoint(dir, { architectures: ['CustomForCausalLM'] }, tensors, 1);
  const planFile = join(dir, 'plan.json');
  writeFileSync(planFile, JSON.stringify({ rules }));
  return planFile;
}

test('row-parallel split of [R, C]: one strided op, rows=R, rowBytes=C/tp*elt, srcPitch=C*elt, srcOffset=start+rank*rowBytes', () =>
  withDir('layout-row', async (dir) => {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 1, shards: 1 });
    const header = await parseSafetensors(join(dir, 'model.safetensors'));
    const down = header.tensors.find((t) => t.name === 'model.layers.0.mlp.down_proj.weight')!;
    const [R, C] = down.shape as [number, number];
    const plan = await planCheckpoint(dir, { tpSize: 4 });
    for (const rank of plan.ranks) {
      const entry = rank.tensors.find((t) => t.name === down.name)!;
      const ops = rank.ops.filter((op) => op.dstOffset >= entry.offset && op.dstOffset < entry.offset + entry.bytes);
      assert.equal(ops, [{ file: 0, segment: 0, srcOffset: down.begin + rank.tpRank * (C / 4) * 2, dstOffset: entry.offset, rows: R, rowBytes: (C / 4) * 2, srcPitch: C * 2 }]);
    }
  }));

test('offsets are 256-aligned, in file then offset order, inside one segment per rank; the plan is deterministic', () =>
  withDir('layout-order', async (dir) => {
    await writeArchCheckpoint(dir, 'Gemma2ForCausalLM', { shards: 3 });
    const plan = await planCheckpoint(dir, { tpSize: 2 });
    assert.equal(await planCheckpoint(dir, { tpSize: 2 }), plan);
    const headers = await Promise.all(plan.ranks[0]!.files.map(parseSafetensors));
    const fileOrder = headers.flatMap((h) => h.tensors.map((t) => t.name));
    for (const rank of plan.ranks) {
      assert.equal(rank.segments.length, 1);
      assert.equal(rank.tensors.map((t) => t.name), fileOrder);
      let end = 0;
      for (const t of rank.tensors) {
        assert.is(t.offset % ARENA_ALIGNMENT, 0, t.name);
        assert.ok(t.offset >= end, `${t.name} overlaps the tensor before it`);
        assert.is(t.segment, 0);
        end = t.offset + t.bytes;
      }
      assert.ok(rank.segments[0]! >= end && rank.segments[0]! % ARENA_ALIGNMENT === 0);
      assert.is(rank.totalBytes, rank.tensors.reduce((a, t) => a + t.bytes, 0));
      assert.is(rank.totalBytes, rank.ops.reduce((a, op) => a + op.rows * op.rowBytes, 0));
    }
  }));

test('contiguous ops are merged: a tp-1 plan of 256-multiple tensors is one op per file', () =>
  withDir('layout-merge', async (dir) => {
    // hidden 128: every BF16 tensor, norms included, is a multiple of 256 bytes.
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { shards: 2, hidden: 128, headDim: 16 });
    const plan = await planCheckpoint(dir, { tpSize: 1 });
    assert.is(plan.ranks[0]!.ops.length, 2);
    const tp2 = await planCheckpoint(dir, { tpSize: 2 });
    assert.ok(tp2.ranks[0]!.ops.length < tp2.ranks[0]!.tensors.length, 'merging should leave fewer ops than tensors');
    for (const op of tp2.ranks[0]!.ops) if (op.rows === 1) assert.is(op.srcPitch, op.rowBytes);
  }));

test('a 3-D tensor split on dim 1 is a [prod(before), size*prod(after)] strided copy', () =>
  withDir('layout-3d', async (dir) => {
    const t = fixtureTensor('w', [4, 6, 10], { dim: 1 }, 'F32');
    const planFile = await custom(dir, [t], [{ pattern: '^w$', rule: { split: 1 } }]);
    const plan = await planCheckpoint(dir, { tpSize: 2, planFile });
    for (const rank of plan.ranks) {
      assert.equal(rank.ops.map((op) => [op.rows, op.rowBytes, op.srcPitch]), [[4, 3 * 10 * 4, 6 * 10 * 4]]);
      const [arena] = await executePlan(rank);
      assert.ok(arena!.subarray(0, rank.tensors[0]!.bytes).equals(expectedPiece(t, 2, rank.tpRank).data));
      assert.equal(rank.tensors[0]!.shape, [4, 3, 10]);
    }
  }));

test('a fused split below dim 0 is copied row by row and lands in row-major order', () =>
  withDir('layout-fused1', async (dir) => {
    const t = fixtureTensor('w', [3, 12], { dim: 1, parts: [{ size: 8 }, { size: 4 }] }, 'BF16');
    const planFile = await custom(dir, [t], [{ pattern: '^w$', rule: { fused: { dim: 1, parts: [8, 4] } } }]);
    const plan = await planCheckpoint(dir, { tpSize: 2, planFile });
    for (const rank of plan.ranks) {
      assert.is(rank.ops.length, 6);
      const [arena] = await executePlan(rank);
      assert.ok(arena!.subarray(0, rank.tensors[0]!.bytes).equals(expectedPiece(t, 2, rank.tpRank).data));
    }
  }));

test('sub-byte F4: splits that stay on byte boundaries work, others are E_SHARD_SUBBYTE', () =>
  withDir('layout-f4', async (dir) => {
    // [8, 16] F4: 8 bytes per row. tp 8 leaves 2 elements (1 byte) per rank, tp 16 half a byte.
    const t = fixtureTensor('w', [8, 16], 'full', 'F4');
    const planFile = await custom(dir, [t], [{ pattern: '^w$', rule: { split: 1 } }]);
    for (const tp of [2, 4, 8]) {
      const plan = await planCheckpoint(dir, { tpSize: tp, planFile });
      for (const rank of plan.ranks) {
        const [arena] = await executePlan(rank);
        const per = 8 / tp;
        const want = Buffer.concat(Array.from({ length: 8 }, (_, r) => Buffer.from(t.data.subarray(r * 8 + rank.tpRank * per, r * 8 + (rank.tpRank + 1) * per))));
        assert.ok(arena!.subarray(0, rank.tensors[0]!.bytes).equals(want), `tp ${tp} rank ${rank.tpRank}`);
        assert.equal(rank.tensors[0]!.shape, [8, 16 / tp]);
      }
    }
    await rejectsWith(() => planCheckpoint(dir, { tpSize: 16, planFile }), ShardingError, 'E_SHARD_SUBBYTE', '"w"', 'F4');
  }));

test('zero-sized tensors get an entry and no op', () =>
  withDir('layout-empty', async (dir) => {
    const tensors = [fixtureTensor('a', [0, 8], 'full'), fixtureTensor('b', [4, 8], { dim: 0 })];
    const planFile = await custom(dir, tensors, [{ pattern: '^a$', rule: 'column' }, { pattern: '^b$', rule: 'column' }]);
    const plan = await planCheckpoint(dir, { tpSize: 2, planFile });
    assert.equal(plan.ranks[1]!.tensors.map((t) => [t.name, t.shape, t.bytes]), [['a', [0, 8], 0], ['b', [2, 8], 32]]);
    assert.is(plan.ranks[1]!.ops.length, 1);
  }));

test.run();
