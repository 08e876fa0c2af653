// The keeper's error codes are one list: what its C++ source replies with, what
// KEEPER_ERROR_CODES (typed as weightd's ErrorCode, so a code errors.ts lacks does not compile)
// lists, and what docs/keeper.md's error table documents.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { KEEPER_ERROR_CODES } from '../../src/keeper/keeperProtocol.js';
import { repoRoot } from '../helpers/paths.js';

test('the codes in native/keeper/ are KEEPER_ERROR_CODES', () => {
  const dir = join(repoRoot, 'native', 'keeper');
  const inSource = new Set<string>();
  for (const name of readdirSync(dir)) {
    for (const m of readFileSync(join(dir, name), 'utf8').matchAll(/"(E_[A-Z0-9_]+)"/g)) inSource.add(m[1]!);
  }
  assert.equal([...inSource].sort(), [...KEEPER_ERROR_CODES].sort());
});

test("docs/keeper.md's error table lists exactly KEEPER_ERROR_CODES", () => {
  const doc = readFileSync(join(repoRoot, 'docs', 'keeper.md'), 'utf8');
  const table = doc.slice(doc.indexOf('## Errors'), doc.indexOf('## TypeScript client'));
  const documented = [...table.matchAll(/^\| `(E_[A-Z0-9_]+)` \|/gm)].map((m) => m[1]!);
  assert.equal(documented.sort(), [...KEEPER_ERROR_CODES].sort());
});

test.run();
