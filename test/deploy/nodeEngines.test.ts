// The Node versions package.json declares are ones every runtime dependency supports: an install
// on the lowest declared Node gets no EBADENGINE warning, and nothing needs a newer Node than
// weightd says it needs. The lock file lists each installed package's own declared range.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import semver from 'semver';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { repoRoot } from '../helpers/paths.js';

const ours = (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { engines: { node: string } }).engines.node;
const lock = JSON.parse(readFileSync(join(repoRoot, 'package-lock.json'), 'utf8')) as {
  packages: Record<string, { dev?: boolean; optional?: boolean; engines?: { node?: string } | string[] }>;
};

test('every runtime dependency supports every Node that package.json declares', () => {
  const narrower: string[] = [];
  let checked = 0;
  for (const [path, p] of Object.entries(lock.packages)) {
    const range = Array.isArray(p.engines) ? undefined : p.engines?.node;
    if (path === '' || p.dev || range === undefined) continue;
    checked++;
    if (!semver.subset(ours, range)) narrower.push(`${path.replace(/^node_modules\//, '')} needs node ${range}`);
  }
  assert.ok(checked > 20, `${checked} ranges checked`);
  assert.equal(narrower, [], `package.json declares node ${ours}, but`);
});

test('the Node running the tests is one package.json declares', () => {
  assert.ok(semver.satisfies(process.version, ours), `${process.version} is outside ${ours}`);
});

test.run();
