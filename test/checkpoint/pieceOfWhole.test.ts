// The regions of a whole tensor's bytes that make a rank's piece (pieceOfWhole, which
// begin_update sends so a writer holding whole tensors cuts each rank's piece by the daemon's one
// rule): gathered from a tensor whose every element is its own index, they give the slice an
// independent index computation expects, for each kind of rule the planner makes.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { pieceOfWhole } from '../../src/checkpoint/shardTensor.js';
import type { ShardRule } from '../../src/checkpoint/types.js';

/** A whole tensor of I32 elements, each its own C-order index: its bytes. */
function indexTensor(shape: number[]): Buffer {
  const n = shape.reduce((a, b) => a * b, 1);
  const b = Buffer.alloc(n * 4);
  for (let i = 0; i < n; i++) b.writeInt32LE(i, i * 4);
  return b;
}

function gather(whole: Buffer, regions: { srcOffset: number; rows: number; rowBytes: number; srcPitch: number }[]): number[] {
  const out: number[] = [];
  for (const r of regions) {
    for (let k = 0; k < r.rows; k++) {
      const at = r.srcOffset + k * r.srcPitch;
      for (let j = 0; j < r.rowBytes; j += 4) out.push(whole.readInt32LE(at + j));
    }
  }
  return out;
}

/** The indexes of a 2-D [R, C] tensor's rows [r0, r1) and columns [c0, c1), in C order. */
function block(cols: number, r0: number, r1: number, c0: number, c1: number): number[] {
  const out: number[] = [];
  for (let r = r0; r < r1; r++) for (let c = c0; c < c1; c++) out.push(r * cols + c);
  return out;
}

function piece(rule: ShardRule, shape: number[], tp: number, rank: number): number[] | undefined {
  const p = pieceOfWhole({ name: 't', dtype: 'I32', fullShape: shape, rule }, tp, rank);
  return p && gather(indexTensor(shape), p.regions);
}

test('replicated, one rank, or no whole shape known: no piece', () => {
  assert.is(piece({ kind: 'replicated' }, [8, 4], 2, 1), undefined);
  assert.is(piece({ kind: 'split', dim: 0 }, [8, 4], 1, 0), undefined);
  assert.is(pieceOfWhole({ name: 't', dtype: 'I32', rule: { kind: 'split', dim: 0 } }, 2, 0), undefined, 'no whole shape known');
});

test('column (dim 0) and row (dim 1) splits', () => {
  assert.equal(piece({ kind: 'split', dim: 0 }, [8, 4], 2, 1), block(4, 4, 8, 0, 4));
  assert.equal(piece({ kind: 'split', dim: 1 }, [8, 4], 2, 0), block(4, 0, 8, 0, 2));
  assert.equal(piece({ kind: 'split', dim: 1 }, [8, 4], 4, 3), block(4, 0, 8, 3, 4));
});

test('KV heads fewer than ranks: ranks 2r and 2r+1 hold head r', () => {
  const rule: ShardRule = { kind: 'split', dim: 0, kvHeads: 2 };
  // 2 heads of 3 rows each, 4 columns, at tp 4.
  assert.equal(piece(rule, [6, 4], 4, 0), block(4, 0, 3, 0, 4));
  assert.equal(piece(rule, [6, 4], 4, 1), block(4, 0, 3, 0, 4));
  assert.equal(piece(rule, [6, 4], 4, 3), block(4, 3, 6, 0, 4));
});

test("a padded vocabulary: a rank's real rows only, none on a rank past them", () => {
  const rule: ShardRule = { kind: 'split', dim: 0, padTo: 64 };
  // 100 rows pad to 128: 32 a rank at tp 4; rank 3 holds rows 96-99.
  assert.equal(piece(rule, [100, 2], 4, 3), block(2, 96, 100, 0, 2));
  // 10 rows pad to 64: 8 a rank at tp 8; rank 1 holds rows 8-9, rank 2 none.
  assert.equal(piece(rule, [10, 2], 8, 1), block(2, 8, 10, 0, 2));
  assert.equal(piece(rule, [10, 2], 8, 2), []);
});

test("fused parts: a rank's piece of each part, in order", () => {
  // Parts of 4, 2 and 2 rows (as q, k and v), each split in two.
  const rule: ShardRule = { kind: 'fused', dim: 0, parts: [4, 2, 2] };
  assert.equal(piece(rule, [8, 3], 2, 1), [...block(3, 2, 4, 0, 3), ...block(3, 5, 6, 0, 3), ...block(3, 7, 8, 0, 3)]);
});

test.run();
