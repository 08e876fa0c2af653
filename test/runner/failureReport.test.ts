// Every failure of a test file, as test/run.mjs runs it, prints its error: a test's error whose
// details are an object (uvu's own report crashed on it and printed nothing, and ran no further
// test of the file), and an error thrown by any hook (which uvu swallowed). The file still fails.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { repoRoot } from '../helpers/paths.js';

const { uvuNodeArgs } = (await import(pathToFileURL(join(repoRoot, 'test/uvuNodeArgs.mjs')).href)) as { uvuNodeArgs: string[] };
const fixture = join(repoRoot, 'dist/test/runner/fixtures/failures.js');

function run(failing: string) {
  const r = spawnSync(process.execPath, [...uvuNodeArgs, fixture], { encoding: 'utf8', env: { ...process.env, FAILING: failing, NO_COLOR: '1', FORCE_COLOR: '0' }, timeout: 60_000 });
  return { ...r, out: r.stdout + r.stderr };
}

test("a test's error prints its name, message, code, details and cause; the file's other tests still run", () => {
  const r = run('test');
  assert.is(r.status, 1, r.out);
  assert.match(r.out, /FAIL {2}"first"\n {4}WeightdError: the device was busy\n {4}code: E_DEVICE_BUSY\n/);
  assert.match(r.out, /details: \{ device: 'host-0', queued: 2 \}/);
  assert.match(r.out, /cause: Error: underlying/);
  assert.match(r.out, /Total: {5}2\n {2}Passed: {4}1\n/);
});

for (const [hook, failed] of [['before', 2], ['before.each', 2], ['after.each', 2], ['after', 0]] as const) {
  test(`an error thrown by the ${hook} hook is printed, and the file fails`, () => {
    const r = run(hook);
    assert.is(r.status, 1, r.out);
    assert.match(r.out, new RegExp(`WeightdError: the ${hook.replace('.', '\\.')} hook broke\\n {4}code: E_INTERNAL\\n`));
    assert.match(r.out, new RegExp(`details: \\{ hook: '${hook.replace('.', '\\.')}' \\}`));
    assert.match(r.out, new RegExp(`Total: {5}2\\n {2}Passed: {4}${2 - failed}\\n`));
  });
}

test.run();
