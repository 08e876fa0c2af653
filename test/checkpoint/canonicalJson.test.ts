// RFC 8785 canonical JSON, weightd's own few lines, held to the vectors the Python client's
// rfc8785 package is held to (clients/python/tests/test_shared_rules.py).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { canonicalJson } from '../../src/checkpoint/canonicalJson.js';
import { repoRoot } from '../helpers/paths.js';

const vectors = JSON.parse(readFileSync(join(repoRoot, 'test/vectors/jcs.json'), 'utf8')) as {
  cases: Array<{ why: string; json: string; canonical: string }>;
  errors: Array<{ why: string; json: string }>;
};

test('every vector: the canonical text of the parsed JSON', () => {
  assert.ok(vectors.cases.length >= 5);
  for (const v of vectors.cases) assert.is(canonicalJson(JSON.parse(v.json)), v.canonical, v.why);
});

test('every refusal: what has no canonical form throws', () => {
  for (const v of vectors.errors) assert.throws(() => canonicalJson(JSON.parse(v.json)), TypeError, v.why);
});

test('values JSON cannot hold throw, and an undefined member is absent as in JSON.stringify', () => {
  for (const bad of [Number.NaN, Infinity, 1n, () => 0, new Date(0), new Map()]) assert.throws(() => canonicalJson(bad), TypeError, String(bad));
  assert.is(canonicalJson({ b: undefined, a: [undefined] }), '{"a":[null]}');
});

test.run();
