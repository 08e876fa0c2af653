// Every failure of a test file, as test/run.mjs runs it and as `node dist/test/x.test.js` does,
// prints its error: a test's error whose details are an object (uvu's own report crashed on it and
// printed nothing, and ran no further test of the file), and an error thrown by any hook (which
// uvu swallowed). The file still fails.
import { spawnSync } from 'node:child_process';
import { cpSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freshTempDir, repoRoot } from '../helpers/paths.js';

const { uvuNodeArgs } = (await import(pathToFileURL(join(repoRoot, 'test/uvuNodeArgs.mjs')).href)) as { uvuNodeArgs: string[] };
const fixture = join(repoRoot, 'dist/test/runner/fixtures/failures.js');

function run(failing: string, nodeArgs = uvuNodeArgs) {
  const r = spawnSync(process.execPath, [...nodeArgs, fixture], { encoding: 'utf8', env: { ...process.env, FAILING: failing, NO_COLOR: '1', FORCE_COLOR: '0' }, timeout: 60_000 });
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

test('a test file run by hand, with no flag, prints the same report', () => {
  for (const failing of ['test', 'before']) {
    const r = run(failing, []);
    assert.is(r.status, 1, r.out);
    assert.match(r.out, failing === 'test' ? /details: \{ device: 'host-0', queued: 2 \}/ : /WeightdError: the before hook broke\n {4}code: E_INTERNAL\n/);
  }
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

// A uvu whose code between the markers changed: patched anyway, the runner would be replaced by
// one written for another version's internals. The hook must refuse it, naming what to do.
function importCopiedUvu(change: (source: string) => string) {
  const modules = join(freshTempDir(), 'node_modules');
  cpSync(join(repoRoot, 'node_modules/uvu'), join(modules, 'uvu'), { recursive: true });
  // uvu's own imports, resolved beside the copy.
  const { dependencies } = JSON.parse(readFileSync(join(modules, 'uvu/package.json'), 'utf8')) as { dependencies: Record<string, string> };
  for (const dep of Object.keys(dependencies)) symlinkSync(join(repoRoot, 'node_modules', dep), join(modules, dep));
  const index = join(modules, 'uvu/dist/index.mjs');
  writeFileSync(index, change(readFileSync(index, 'utf8')));
  const report = pathToFileURL(join(repoRoot, 'test/uvuFailureReport.mjs')).href;
  const r = spawnSync(process.execPath, ['--import', report, '--input-type=module', '-e', `await import(${JSON.stringify(pathToFileURL(index).href)})`], { encoding: 'utf8', timeout: 60_000 });
  return { ...r, out: r.stdout + r.stderr };
}

test('the report hook loads the uvu it was written for, and refuses one whose format or runner changed', () => {
  const same = importCopiedUvu((s) => s);
  assert.is(same.status, 0, same.out);
  const changed = importCopiedUvu((s) => s.replace('write(PASS);', 'write(PASS + "");'));
  assert.is.not(changed.status, 0, changed.out);
  assert.match(changed.out, /uvuFailureReport\.mjs: .*update it for the installed version/);
});

test.run();
