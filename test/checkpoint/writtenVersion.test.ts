// A written version's fingerprint (docs/spec/fingerprint.md §9) against test/vectors/written-version.json,
// whose values were computed apart from src/checkpoint/fingerprint.ts.
import { readFileSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { repoRoot } from '../helpers/paths.js';
import { rankFingerprint, writtenVersionFingerprint } from '../../src/checkpoint/fingerprint.js';

interface WrittenCase {
  baseFields: Record<string, string>;
  rankDigests: string[][];
  expected: { fields: Record<string, string>; fingerprint: string; rankFingerprints: string[] };
}

const vectors = JSON.parse(readFileSync(`${repoRoot}test/vectors/written-version.json`, 'utf8')) as { cases: WrittenCase[] };

test('a written version is fingerprinted by its base fields and every rank\'s tensor digests, as the vectors say', () => {
  for (const c of vectors.cases) {
    const got = writtenVersionFingerprint(c.baseFields, c.rankDigests);
    assert.equal(got.fields, c.expected.fields);
    assert.is(got.fingerprint, c.expected.fingerprint);
    assert.equal(c.rankDigests.map((_, r) => rankFingerprint(got.fingerprint, r)), c.expected.rankFingerprints);
  }
});

test('a digest of any rank, or the ranks\' order, changes the fingerprint', () => {
  const c = vectors.cases[0]!;
  const base = writtenVersionFingerprint(c.baseFields, c.rankDigests).fingerprint;
  assert.is.not(writtenVersionFingerprint(c.baseFields, [c.rankDigests[0]!, ['f'.repeat(32), c.rankDigests[1]![1]!]]).fingerprint, base);
  assert.is.not(writtenVersionFingerprint(c.baseFields, [...c.rankDigests].reverse()).fingerprint, base);
});

test.run();
