// A user plan file: its rules come first (first match wins), extend the built-in tables to
// unknown architectures, and are validated with errors that say which rule is wrong.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { CheckpointError, ShardingError } from '../../src/errors.js';
import { executePlan, expectedPiece, fixtureTensor, makeTempDir, rejectsWith, removeDir, writeArchCheckpoint, writeCheckpoint, type FixtureTensor } from '../helpers/checkpoints.js';

function writePlan(dir: string, plan: unknown): string {
  const path = join(dir, 'plan.json');
  writeFileSync(path, typeof plan === 'string' ? plan : JSON.stringify(plan));
  return path;
}

async function assertBytes(dir: string, tensors: FixtureTensor[], tp: number, planFile: string): Promise<void> {
  const plan = await planCheckpoint(dir, { tpSize: tp, planFile });
  for (const rank of plan.ranks) {
    const [arena] = await executePlan(rank);
    for (const t of tensors) {
      const e = rank.tensors.find((x) => x.name === t.name)!;
      const want = expectedPiece(t, tp, rank.tpRank);
      assert.equal(e.shape, want.shape, t.name);
      assert.ok(arena!.subarray(e.offset, e.offset + e.bytes).equals(want.data), `${t.name} rank ${rank.tpRank}`);
    }
  }
}

test('plan file rules override the built-in table; the rest keep their built-in rule', async () => {
  const dir = makeTempDir('plan-override');
  try {
    const tensors = await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 1 });
    const planFile = writePlan(dir, { rules: [{ pattern: '\\.o_proj\\.weight$', rule: 'replicated' }, { pattern: '\\.o_proj\\.weight$', rule: 'row' }] });
    for (const t of tensors) if (t.name.endsWith('o_proj.weight')) t.expect = 'full';
    await assertBytes(dir, tensors, 4, planFile);
  } finally {
    removeDir(dir);
  }
});

test('an unknown architecture is fully described by a plan file', async () => {
  const dir = makeTempDir('plan-unknown');
  try {
    const tensors = [
      fixtureTensor('net.tok.weight', [64, 32], { dim: 0 }),
      fixtureTensor('net.blocks.0.wqkv.weight', [96, 32], { dim: 0, parts: [{ size: 32 }, { size: 32 }, { size: 32 }] }),
      fixtureTensor('net.blocks.0.wo.weight', [32, 32], { dim: 1 }),
      fixtureTensor('net.blocks.0.wo.bias', [32], 'full'),
      fixtureTensor('net.blocks.0.conv.weight', [4, 8, 6], { dim: 1 }, 'F32'),
      fixtureTensor('net.blocks.0.scale', [32], 'full', 'F32'),
    ];
    await writeCheckpoint(dir, { architectures: ['MyNetForCausalLM'] }, tensors, 1);
    const planFile = writePlan(dir, {
      rules: [
        { pattern: '^net\\.tok\\.weight$', rule: 'column' },
        { pattern: '\\.wqkv\\.weight$', rule: { fused: { dim: 0, parts: [32, 32, 32] } } },
        // "row" on a bias (one dim) means replicated, as for the built-in row-parallel layers.
        { pattern: '\\.wo\\.(weight|bias)$', rule: 'row' },
        { pattern: '\\.conv\\.weight$', rule: { split: 1 } },
        { pattern: '\\.scale$', rule: 'replicated' },
      ],
    });
    await assertBytes(dir, tensors, 2, planFile);
    await assertBytes(dir, tensors, 4, planFile);
  } finally {
    removeDir(dir);
  }
});

function badPlan(name: string, plan: unknown, cls: typeof CheckpointError | typeof ShardingError, code: string, ...mentions: string[]): void {
  test(`${name}: ${code}`, async () => {
    const dir = makeTempDir('plan-bad');
    try {
      await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 1 });
      await rejectsWith(() => planCheckpoint(dir, { tpSize: 2, planFile: writePlan(dir, plan) }), cls, code, ...mentions);
    } finally {
      removeDir(dir);
    }
  });
}

badPlan('not JSON', '{"rules": [', CheckpointError, 'E_PLAN_JSON', 'plan.json');
badPlan('no rules array', { pattern: 'x' }, CheckpointError, 'E_PLAN_SCHEMA', 'rules');
badPlan('unknown rule name', { rules: [{ pattern: 'x', rule: 'diagonal' }] }, CheckpointError, 'E_PLAN_SCHEMA', 'rules.0.rule');
badPlan('negative split dim', { rules: [{ pattern: 'x', rule: { split: -1 } }] }, CheckpointError, 'E_PLAN_SCHEMA', 'rules.0.rule');
badPlan('unknown key in a rule', { rules: [{ pattern: 'x', rule: 'column', when: 'always' }] }, CheckpointError, 'E_PLAN_SCHEMA', 'when');
badPlan('invalid regular expression', { rules: [{ pattern: '(q_proj', rule: 'column' }] }, CheckpointError, 'E_PLAN_BAD_REGEX', '(q_proj', 'rules[0]');
badPlan('partKvHeads of the wrong length', { rules: [{ pattern: 'x', rule: { fused: { dim: 0, parts: [1, 1], partKvHeads: [0] } } }] }, CheckpointError, 'E_PLAN_SCHEMA', 'partKvHeads');
badPlan('split on a dim the tensor lacks', { rules: [{ pattern: 'norm\\.weight$', rule: { split: 1 } }] }, ShardingError, 'E_SHARD_BAD_DIM', 'norm.weight', 'dim 1');
badPlan('a fused part of size 0', { rules: [{ pattern: 'q_proj\\.weight$', rule: { fused: { dim: 0, parts: [64, 0] } } }] }, ShardingError, 'E_SHARD_FUSED_PARTS', 'q_proj.weight', '[64,0]');
badPlan('fused parts that do not add up', { rules: [{ pattern: 'q_proj\\.weight$', rule: { fused: { dim: 0, parts: [32, 16] } } }] }, ShardingError, 'E_SHARD_FUSED_PARTS', 'q_proj.weight', '[32,16]', '64');

test('segmentBytes cuts each rank\'s arena into segments at tensor boundaries, each tensor whole and its bytes where the entry says', async () => {
  const dir = makeTempDir('plan-segments');
  try {
    const tensors = await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 2 });
    const segmentBytes = 4096;
    const plan = await planCheckpoint(dir, { tpSize: 2, planFile: writePlan(dir, { rules: [], segmentBytes }) });
    for (const rank of plan.ranks) {
      assert.ok(rank.segments.length > 2, `rank ${rank.tpRank}: ${rank.segments.length} segment(s)`);
      const arenas = await executePlan(rank);
      for (const t of tensors) {
        const e = rank.tensors.find((x) => x.name === t.name)!;
        assert.ok(e.offset + e.bytes <= rank.segments[e.segment]!, `${t.name} lies inside segment ${e.segment}`);
        assert.ok(arenas[e.segment]!.subarray(e.offset, e.offset + e.bytes).equals(expectedPiece(t, 2, rank.tpRank).data), `${t.name} rank ${rank.tpRank}`);
      }
      // A segment ends once it holds segmentBytes: each but the last reaches it; a new one starts at offset 0.
      for (const bytes of rank.segments.slice(0, -1)) assert.ok(bytes >= segmentBytes, `${bytes} >= ${segmentBytes}`);
      assert.ok(rank.segments.every((_, i) => rank.tensors.some((e) => e.segment === i && e.offset === 0)));
    }
  } finally {
    removeDir(dir);
  }
});

test('a plan file that does not exist: E_PLAN_READ', async () => {
  const dir = makeTempDir('plan-missing');
  try {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { layers: 1 });
    await rejectsWith(() => planCheckpoint(dir, { tpSize: 2, planFile: join(dir, 'nope.json') }), CheckpointError, 'E_PLAN_READ', 'nope.json');
  } finally {
    removeDir(dir);
  }
});

test.run();
