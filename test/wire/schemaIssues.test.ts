// How a schema's refusal of a peer's request is told (schemaIssues): the first five issues, each
// path and message clipped, and how many more there were. A key of 900 KB in a request's path
// came back whole in the error reply and in every log line of it.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { z } from 'zod';
import { schemaIssues } from '../../src/errors.js';

test('five issues at most, each clipped, and a count of the rest', () => {
  const key = 'k'.repeat(900_000);
  const parsed = z.record(z.string(), z.number()).safeParse(Object.fromEntries([[key, 'x'], ...Array.from({ length: 9 }, (_, i) => [`f${i}`, 'x'])]));
  assert.not.ok(parsed.success);
  const said = schemaIssues(parsed.error!.issues);
  assert.ok(said.length < 2000, `${said.length} characters`);
  assert.match(said, /^k{120}… \(900000 characters\): /);
  assert.match(said, /; and 5 more$/);
});

test('a short refusal is told whole', () => {
  const parsed = z.object({ id: z.number() }).safeParse({ id: 'x' });
  assert.is(schemaIssues(parsed.error!.issues), 'id: Invalid input: expected number, received string');
});

test.run();
