// dist/main.cjs, the one-file entry the launchers run (scripts/bundle-main.mjs), serves as
// dist/main.js does. What bundling could break is checked where it would show: the paths each
// module makes from its own import.meta (the inspect page's files, mermaid from node_modules, the
// rank's worker thread and the addon), the packages left in node_modules, and the commands.
// A preload (fixtures/recordModules.ts) records what each thread loaded: the bundle, not the
// daemon's ES modules, on the main thread, and the rank thread's bundle on the rank's.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DRAWN_MACHINE_NAMES } from '../../src/machines/drawnMachineNames.js';
import { plannerDigest } from '../../src/keeper/keptPlan.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel, freshSocketDir, freshTempDir, mainJs, repoRoot } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';
import { httpGet } from '../inspect/httpGet.js';

const mainCjs = join(repoRoot, 'dist/main.cjs');
const recorder = new URL('./fixtures/recordModules.js', import.meta.url).href;

test('a daemon of dist/main.cjs serves, with its inspect page, and ctl of it lists', async () => {
  const record = join(freshTempDir(), 'modules.txt');
  const socketDir = freshSocketDir();
  const daemon = await startDaemon({
    model: exampleModel,
    socketDir,
    script: mainCjs,
    extraArgs: ['--inspect-port', '0'],
    env: { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${recorder}`, WEIGHTD_TEST_MODULES: record },
  });
  try {
    const url = /"url":"(http:[^"]+)"/.exec(daemon.stderr())?.[1];
    assert.ok(url, `the inspect server's url is logged:\n${daemon.stderr()}`);
    for (const asset of ['/assets/mermaid.min.js', '/assets/loadProgress.js', '/assets/statechart.js']) {
      const r = await httpGet(`${url}${asset}`);
      assert.is(r.status, 200, `${asset}: ${r.body.slice(0, 200)}`);
      assert.ok(r.body.length > 1000, `${asset} is the file, not an error`);
    }
    assert.match((await httpGet(`${url}/metrics`)).body, /^weightd_node_state\{state="ready"\} 1$/m);
    const list = await runCli(['ctl', 'list', '--weight-cache-socket-dir', socketDir]);
    assert.is(list.code, 0, list.stderr);
    assert.match(list.stdout, /^tiny-llama \(own\) {2}v0 {2}serving /m);
  } finally {
    assert.equal(await daemon.stop(), { code: 0, signal: null }, daemon.stderr().slice(-2000));
  }
  const lines = readFileSync(record, 'utf8').trim().split('\n');
  const mainThread = lines.filter((l) => l.startsWith('cjs 0 ')).map((l) => l.slice(6));
  assert.ok(mainThread.includes(mainCjs), 'the main thread ran the bundle');
  const rankThreads = lines.filter((l) => /^cjs [1-9]\d* /.test(l) && l.endsWith('/dist/rank-thread.cjs'));
  assert.ok(rankThreads.length > 0, "the rank's worker thread ran the rank thread's bundle");
  assert.not.ok(
    lines.some((l) => l.includes('/dist/src/actors/')),
    `no thread loaded the rank's unbundled modules: ${lines.filter((l) => l.includes('/dist/src/actors/')).join(', ')}`,
  );
  // ES modules are recorded by the loader's hook for every thread alike; the main thread's would be startNode's.
  assert.not.ok(lines.some((l) => l.endsWith('/dist/src/startNode.js')), 'no thread loaded the unbundled node');
});

test('dist/main.cjs prints what dist/main.js prints', () => {
  // Every chart, since guards are drawn by their functions' names, which a bundler may rename.
  const charts = DRAWN_MACHINE_NAMES.map((m) => ['statechart', '--machine', m, '--format', 'json']);
  for (const args of [['--version'], ['--help'], ...charts]) {
    const [bundled, unbundled] = [mainCjs, mainJs].map((main) => spawnSync(process.execPath, [main, ...args], { encoding: 'utf8' }));
    assert.is(bundled!.status, 0, bundled!.stderr);
    assert.is(bundled!.stdout, unbundled!.stdout, args.join(' '));
  }
});

test("dist/main.cjs keys kept plans by the digest of the planning modules it was bundled from, not one it takes at start", () => {
  // A plan kept by a daemon of dist/main.js is then one the bundle's daemon finds, and the reverse
  // (src/keeper/keptPlan.ts): both name the same planning code.
  const digest = plannerDigest(join(repoRoot, 'dist/src/'));
  const bundle = readFileSync(mainCjs, 'utf8');
  assert.ok(bundle.includes(`"${digest}"`), `dist/main.cjs carries the digest ${digest}`);
});

test.run();
