// The shared vectors (test/vectors/fingerprint/cases.json): the daemon's planner and the
// TypeScript client compute exactly the fields the file holds; the Python client's test
// (clients/python/tests/test_fingerprint.py) holds its implementation to the same file.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { diskDigests } from '../../src/native/diskDigests.js';
import { sha256Hex } from '../../src/checkpoint/fingerprint.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { sampleWithAddon } from '../../src/native/sampleDigest.js';
import { expectedFingerprint } from '../../src/client/expectedFingerprint.js';
import { CheckpointError } from '../../src/errors.js';
import { makeTempDir, rejectsWith, removeDir } from '../helpers/checkpoints.js';
import { materialize, readVectors } from '../vectors/fingerprint/vectorCases.js';

const vectors = readVectors();

for (const c of vectors.cases) {
  test(c.name, async () => {
    const root = makeTempDir('fpvec');
    try {
      const { modelDir, planFile } = materialize(vectors, c, root);
      if (c.error) {
        await rejectsWith(() => planCheckpoint(modelDir, { tpSize: c.tpSize, planFile }), CheckpointError, 'E_ST_DATA_TRUNCATED');
        await rejectsWith(() => planCheckpoint(modelDir, { tpSize: c.tpSize, planFile, sampler: sampleWithAddon }), CheckpointError, 'E_ST_DATA_TRUNCATED');
        return;
      }
      const want = c.expected!;
      const plan = await planCheckpoint(modelDir, { tpSize: c.tpSize, planFile });
      assert.equal(plan.fingerprintFields, want.fields);
      assert.is(plan.fingerprint, want.checkpointFingerprint);
      // A daemon's planning samples with the addon: the same fields.
      assert.equal((await planCheckpoint(modelDir, { tpSize: c.tpSize, planFile, sampler: sampleWithAddon })).fingerprintFields, want.fields);
      for (const [rank, r] of want.ranks.entries()) {
        const expected = await expectedFingerprint(modelDir, c.tpSize, rank, planFile);
        assert.is(expected.fingerprint, r.fingerprint);
        assert.equal(expected.fingerprintFields, { ...want.fields, tpRank: r.tpRank });
      }
      const digests = await diskDigests(plan);
      assert.equal(Object.fromEntries(plan.ranks[0]!.contentTensors.names.map((n, i) => [n, digests[i]])), want.full!.tensorDigests);
      const full = await expectedFingerprint(modelDir, c.tpSize, 0, planFile, 'checkpoint', true);
      assert.is(full.fingerprint, want.full!.rank0);
      assert.is(full.fingerprintFields!.content, want.full!.content);
      assert.is(full.fingerprintFields!.protocol, sha256Hex('3'));
    } finally {
      removeDir(root);
    }
  });
}

test('the TypeScript client, as the Python one, computes only the checkpoint layout and says which exist', async () => {
  try {
    await expectedFingerprint('/nonexistent', 2, 0, undefined, 'vllm' as 'checkpoint');
    assert.unreachable('accepted an unknown layout');
  } catch (err) {
    assert.instance(err, RangeError);
    assert.match((err as Error).message, 'layout "vllm" is not one a fingerprint can be computed for; the layouts are: checkpoint');
  }
});

test('the vectors cover every field and both sampling regimes', () => {
  const changed = new Set<string>();
  const base = new Map<string, Record<string, string>>();
  for (const c of vectors.cases) {
    if (!c.expected) continue;
    const first = base.get(c.model) ?? (base.set(c.model, c.expected.fields), c.expected.fields);
    for (const [k, v] of Object.entries(c.expected.fields)) if (first[k] !== v) changed.add(k);
  }
  for (const field of ['content', 'config', 'plan', 'tpSize', 'dtypes', 'quantization']) assert.ok(changed.has(field), `no case changes ${field}`);
  assert.ok(vectors.cases.some((c) => c.error), 'a case that must fail');
  assert.ok('synthetic' in vectors.models['sampled-llama']!, 'a model over the whole-hash limit');
});

test.run();
