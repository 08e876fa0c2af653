// test/run.mjs, the runner `npm test` ends with: its closing line always has the three counts,
// and a summary before it says why each skipped test was skipped. Run here on one quick file and
// one that skips (the state-chart page, with no Chromium where it is told to look).
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { repoRoot } from '../helpers/paths.js';

test('the closing line is "N passed, N failed, N skipped", after one line per skip saying why', () => {
  const r = spawnSync(process.execPath, [join(repoRoot, 'test/run.mjs'), '^(inspect/statechartPage|deploy/nodeEngines)\\.test\\.js$'], {
    cwd: repoRoot,
    encoding: 'utf8',
    env: { ...process.env, WEIGHTD_CHROMIUM: '/nonexistent/chromium' },
    timeout: 120_000,
  });
  assert.is(r.status, 0, r.stdout + r.stderr);
  const lines = r.stdout.trim().split('\n');
  assert.is(lines.at(-1), '2 passed, 0 failed, 1 skipped');
  assert.match(r.stdout, /\nskipped:\n {2}inspect\/statechartPage\.test\.js: no Chromium at \/nonexistent\/chromium\. Install Debian's/);
});

test('with nothing skipped the closing line still counts the skips', () => {
  const r = spawnSync(process.execPath, [join(repoRoot, 'test/run.mjs'), '^deploy/nodeEngines\\.test\\.js$'], { cwd: repoRoot, encoding: 'utf8', timeout: 120_000 });
  assert.is(r.status, 0, r.stdout + r.stderr);
  assert.is(r.stdout.trim().split('\n').at(-1), '2 passed, 0 failed, 0 skipped');
  assert.not.match(r.stdout, /skipped:/);
});

test.run();
