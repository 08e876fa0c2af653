// Which ranks must hold the same bytes of a tensor (src/serve/replicaDigests.ts): every rank a
// replicated one, each run of tp / kvHeads ranks a key/value head when heads are fewer than
// ranks; a split, fused or padded piece is a rank's own. A written version's digests are
// compared across exactly those ranks.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { ShardRule } from '../../src/checkpoint/types.js';
import { replicaMismatches, replicaPiece } from '../../src/serve/replicaDigests.js';

const replicated: ShardRule = { kind: 'replicated' };
const kv2: ShardRule = { kind: 'split', dim: 0, kvHeads: 2 };

test('the piece each rank holds: whole when replicated, a KV head shared by tp / kvHeads ranks, else its own', () => {
  assert.equal([0, 1, 2, 3].map((r) => replicaPiece(replicated, r, 4)), ['whole', 'whole', 'whole', 'whole']);
  assert.equal([0, 1, 2, 3, 4, 5, 6, 7].map((r) => replicaPiece(kv2, r, 8)), ['head 0', 'head 0', 'head 0', 'head 0', 'head 1', 'head 1', 'head 1', 'head 1']);
  // As many heads as ranks, or more: every rank holds heads of its own.
  assert.equal([0, 1].map((r) => replicaPiece(kv2, r, 2)), [undefined, undefined]);
  assert.is(replicaPiece({ kind: 'split', dim: 1 }, 0, 4), undefined);
  assert.is(replicaPiece({ kind: 'fused', dim: 0, parts: [8, 4, 4], partKvHeads: [0, 1, 1] }, 0, 4), undefined);
  assert.is(replicaPiece(replicated, 0, 1), undefined, 'one rank: nothing to agree with');
  assert.is(replicaPiece(undefined, 0, 2), undefined);
});

test('mismatches: each piece whose ranks differ, once, naming the first two ranks; pieces of different heads may differ', () => {
  const tensors = [
    { name: 'norm', rule: replicated },
    { name: 'k_proj', rule: kv2 },
    { name: 'q_proj', rule: { kind: 'split', dim: 0 } as ShardRule },
  ];
  const rank = (globalRank: number, digests: string[]) => ({ globalRank, tp: 4, tensors, digests });
  // k_proj: heads of ranks 0-1 and 2-3; q_proj differs on every rank, as it should.
  const alike = [rank(0, ['n', 'h0', 'q0']), rank(1, ['n', 'h0', 'q1']), rank(2, ['n', 'h1', 'q2']), rank(3, ['n', 'h1', 'q3'])];
  assert.equal(replicaMismatches(alike), []);
  const differ = [rank(3, ['x', 'h1', 'q3']), rank(0, ['n', 'h0', 'q0']), rank(1, ['n', 'h0', 'q1']), rank(2, ['y', 'H', 'q2'])];
  assert.equal(replicaMismatches(differ), [
    { name: 'norm', piece: 'whole', ranks: [0, 2] },
    { name: 'k_proj', piece: 'head 1', ranks: [2, 3] },
  ]);
});

test.run();
