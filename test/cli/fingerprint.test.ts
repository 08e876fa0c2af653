// `weightd fingerprint` prints what the daemon will report for each rank, so a client in any
// language can ask get_state for exactly this checkpoint and sharding.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint } from '../../src/client/index.js';
import { exampleModel } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';

test('prints every rank fingerprint and its fields, equal to the TypeScript client\'s', async () => {
  const r = await runCli(['fingerprint', '--model', exampleModel, '-tp', '2']);
  assert.is(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout) as { tpSize: number; ranks: Array<{ globalRank: number; fingerprint: string; fingerprintFields: Record<string, string> }> };
  assert.is(out.tpSize, 2);
  for (const rank of [0, 1]) {
    const expected = await expectedFingerprint(exampleModel, 2, rank);
    assert.is(out.ranks[rank]!.fingerprint, expected.fingerprint);
    assert.equal(out.ranks[rank]!.fingerprintFields, expected.fingerprintFields);
  }
  assert.is.not(out.ranks[0]!.fingerprint, out.ranks[1]!.fingerprint, 'each rank has its own');
});

test('a bad flag, and a tp size the checkpoint cannot be sharded by, exit 2 naming why', async () => {
  const bad = await runCli(['fingerprint', '--model', '/nonexistent']);
  assert.is(bad.code, 2);
  assert.match(bad.messages, /--model "\/nonexistent": cannot be read/);
  const unshardable = await runCli(['fingerprint', '--model', exampleModel, '-tp', '3']);
  assert.is(unshardable.code, 2, 'a tp size the shapes do not divide is a usage error');
  assert.match(unshardable.messages, /not divisible by tp size 3/);
  assert.not.match(unshardable.stderr, /internal error/);
});

test.run();
