// Building the Python client (what `pip install ./clients/python` does) writes nothing into its
// source tree: no build/, no *.egg-info (clients/python/build_backend builds from a copy).
// Run on a copy of the sources, so that a failure cannot litter the checkout.
import { spawnSync } from 'node:child_process';
import { cpSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freshTempDir, repoRoot } from '../helpers/paths.js';
import { PYTHON } from './runClient.js';

function tree(dir: string, root = dir): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    return e.isDirectory() ? [`${relative(root, p)}/`, ...tree(p, root)] : [relative(root, p)];
  });
}

test('a wheel of clients/python leaves its sources as they were, and holds the package', () => {
  const work = freshTempDir();
  const sources = join(work, 'python');
  cpSync(join(repoRoot, 'clients/python'), sources, { recursive: true, filter: (src) => !/(^|\/)(build|__pycache__|[^/]*\.egg-info)$/.test(src) });
  const before = tree(sources);
  const r = spawnSync(PYTHON, ['-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '--no-index', '--quiet', '--wheel-dir', join(work, 'wheels'), sources], {
    encoding: 'utf8',
    env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' },
  });
  assert.is(r.status, 0, r.stderr);
  assert.equal(tree(sources), before, 'nothing added to the source tree');
  assert.equal(readdirSync(join(work, 'wheels')), ['weightd_client-0.1.0-py3-none-any.whl']);
});

test.run();
