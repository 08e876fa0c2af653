// A written version's manifest digest (docs/spec/kept-written.md §2) against
// test/vectors/kept-written.json, whose values were computed apart from src/keeper/writtenIdentity.ts,
// and what the identity check names when it refuses a record.
import { readFileSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { CheckpointPlan } from '../../src/checkpoint/types.js';
import { manifestDigest, writtenIdentityRefusal } from '../../src/keeper/writtenIdentity.js';
import { repoRoot } from '../helpers/paths.js';

interface ManifestCase {
  description: string;
  ranks: CheckpointPlan['ranks'];
  expected: { manifest: string };
}

const vectors = JSON.parse(readFileSync(`${repoRoot}test/vectors/kept-written.json`, 'utf8')) as { cases: ManifestCase[] };

test('the manifest digest is the SHA-256 of every rank\'s tensors and sorted aliases, as the vectors say', () => {
  for (const c of vectors.cases) assert.is(manifestDigest(c.ranks), c.expected.manifest, c.description);
  assert.is.not(vectors.cases[0]!.expected.manifest, vectors.cases[1]!.expected.manifest, 'two names swapped, nothing moved');
});

test('a refusal names the directories, then every field that differs besides content and protocol, then the manifest', () => {
  const ranks = vectors.cases[0]!.ranks;
  const fields = { headers: 'h1', config: 'c1', content: 'x', protocol: 'p' };
  const e = { name: 'tiny', modelDir: '/m/a', plan: { fingerprintFields: { ...fields, content: 'y', protocol: 'q' }, ranks } };
  const written = { fields, manifest: manifestDigest(ranks) };
  assert.is(writtenIdentityRefusal({ model: '/m/a', written }, e), undefined, 'content and protocol are the version\'s own');
  assert.match(writtenIdentityRefusal({ model: '/m/b', written }, e)!, 'written over the checkpoint in /m/b, and this start serves model "tiny" from /m/a');
  assert.match(writtenIdentityRefusal({ model: '/m/a', written: { ...written, fields: { ...fields, headers: 'h0', config: 'c0' } } }, e)!, "fingerprint's config, headers (docs/spec/fingerprint.md §4)");
  assert.match(writtenIdentityRefusal({ model: '/m/a', written: { ...written, fields: { ...fields, quantization: 'q' } } }, e)!, "fingerprint's quantization");
  assert.match(writtenIdentityRefusal({ model: '/m/a', written: { ...written, manifest: vectors.cases[1]!.expected.manifest } }, e)!, 'its tensors (names, dtypes, shapes, places) are not the ones model "tiny" has now');
});

test.run();
