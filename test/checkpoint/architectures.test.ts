// Every supported architecture, sharded for tp 1, 2, 4 and 8: each rank's arena, filled by
// running the plan's ops, must hold exactly the slices vLLM's loader would cut from the
// original tensors.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { ARCHITECTURES, executePlan, expectedPiece, makeTempDir, removeDir, writeArchCheckpoint } from '../helpers/checkpoints.js';

for (const arch of ARCHITECTURES) {
  test(`${arch}: every rank's bytes equal an independent slicing, tp 1/2/4/8`, async () => {
    const dir = makeTempDir('arch');
    try {
      const tensors = await writeArchCheckpoint(dir, arch);
      for (const tp of [1, 2, 4, 8]) {
        const plan = await planCheckpoint(dir, { tpSize: tp });
        assert.is(plan.architecture, arch);
        assert.is(plan.ranks.length, tp);
        for (const rank of plan.ranks) {
          const [arena] = await executePlan(rank);
          const byName = new Map(rank.tensors.map((e) => [e.name, e]));
          for (const t of tensors) {
            const entry = byName.get(t.name);
            assert.ok(entry, `${arch} tp${tp} rank ${rank.tpRank}: ${t.name} is missing`);
            const want = expectedPiece(t, tp, rank.tpRank);
            assert.equal(entry.shape, want.shape, `${t.name} shape, tp${tp} rank ${rank.tpRank}`);
            assert.is(entry.bytes, want.data.length);
            assert.is(entry.offset % 256, 0);
            assert.ok(arena!.subarray(entry.offset, entry.offset + entry.bytes).equals(want.data), `${arch} tp${tp} rank ${rank.tpRank}: bytes of ${t.name} differ`);
          }
          const isGemma = arch.startsWith('Gemma');
          assert.equal(rank.aliases, isGemma ? { 'lm_head.weight': 'model.embed_tokens.weight' } : {});
          assert.is(rank.tensors.length, tensors.length);
        }
      }
    } finally {
      removeDir(dir);
    }
  });
}

test('a single-file checkpoint without an index plans like a sharded one', async () => {
  const dir = makeTempDir('single');
  try {
    const tensors = await writeArchCheckpoint(dir, 'LlamaForCausalLM', { shards: 1 });
    const plan = await planCheckpoint(dir, { tpSize: 2 });
    assert.is(plan.ranks[0]!.files.length, 1);
    assert.ok(plan.ranks[0]!.files[0]!.endsWith('/model.safetensors'));
    const [arena] = await executePlan(plan.ranks[1]!);
    for (const t of tensors) {
      const e = plan.ranks[1]!.tensors.find((x) => x.name === t.name)!;
      assert.ok(arena!.subarray(e.offset, e.offset + e.bytes).equals(expectedPiece(t, 2, 1).data), t.name);
    }
  } finally {
    removeDir(dir);
  }
});

test.run();
