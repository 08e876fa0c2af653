// Runs the Python client's own unit tests (clients/python/tests) under this suite's runner.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { repoRoot } from '../helpers/paths.js';
import { PYTHON } from './runClient.js';

test('python client unit tests pass', () => {
  const dir = join(repoRoot, 'clients/python');
  const r = spawnSync(PYTHON, ['-m', 'unittest', 'discover', '-s', 'tests'], {
    cwd: dir,
    env: { ...process.env, PYTHONPATH: dir, PYTHONDONTWRITEBYTECODE: '1' },
    encoding: 'utf8',
  });
  assert.is(r.status, 0, r.stderr);
  assert.match(r.stderr, /^OK/m);
});

test.run();
