// `weightd --help` and `weightd statechart` need no addon: they run from a copy of the package
// that has dist/ and package.json but no build/ (a checkout where the addon was never built).
import { cpSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freshSocketDir, repoRoot } from '../helpers/paths.js';

const pkg = mkdtempSync(join(tmpdir(), 'weightd-noaddon-'));
cpSync(join(repoRoot, 'dist'), join(pkg, 'dist'), { recursive: true });
cpSync(join(repoRoot, 'package.json'), join(pkg, 'package.json'));
symlinkSync(join(repoRoot, 'node_modules'), join(pkg, 'node_modules'));
const run = (...args: string[]) => spawnSync(process.execPath, [join(pkg, 'dist', 'main.js'), ...args], { encoding: 'utf8', timeout: 20_000 });

test('the copy really has no addon: starting a node says so', () => {
  // A socket directory of its own: another daemon on the machine holding the default one's
  // device lock would refuse this start first (E_DEVICE_LOCKED), before the addon is loaded.
  const socketDir = freshSocketDir();
  const r = run('--model', join(repoRoot, 'examples', 'tiny-llama'), '--device', 'host', '--weight-cache-socket-dir', socketDir);
  rmSync(socketDir, { recursive: true, force: true });
  assert.is(r.status, 1, r.stderr);
  assert.match(r.stderr, /cannot load the native addon/);
});

test('--help runs without the addon', () => {
  const r = run('--help');
  assert.is(r.status, 0, r.stderr);
  assert.match(r.stdout, /--model <dir>/);
});

test('statechart runs without the addon, in both formats', () => {
  const mermaid = run('statechart');
  assert.is(mermaid.status, 0, mermaid.stderr);
  assert.match(mermaid.stdout, /^stateDiagram-v2/m);
  const json = run('statechart', '--format', 'json');
  assert.is(json.status, 0, json.stderr);
  assert.ok((JSON.parse(json.stdout) as { states: unknown[] }).states.length > 5);
});

test('statechart draws the coordinator and the rank service too, and names the machines it knows', () => {
  const coordinator = run('statechart', '--machine', 'coordinator');
  assert.is(coordinator.status, 0, coordinator.stderr);
  assert.match(coordinator.stdout, /^stateDiagram-v2/m);
  assert.match(coordinator.stdout, /gathering/);
  const service = JSON.parse(run('statechart', '--machine', 'rankService', '--format', 'json').stdout) as { states: Array<{ key: string }> };
  assert.equal(service.states.map((s) => s.key), ['serving', 'draining', 'releasing', 'released']);
  // The rank's worker thread and the group member declare their I/O as placeholders: drawn with no addon too.
  for (const [machine, state] of [['rankWorker', 'exporting'], ['groupMember', 'rejoining']]) {
    const drawn = run('statechart', '--machine', machine!);
    assert.is(drawn.status, 0, drawn.stderr);
    assert.match(drawn.stdout, new RegExp(state!));
  }
  const wrong = run('statechart', '--machine', 'rankserver');
  assert.is.not(wrong.status, 0);
  assert.match(wrong.stderr, /rankserver.*supervisor, coordinator, groupMember, rankService, rankWorker|supervisor, coordinator, groupMember, rankService, rankWorker.*rankserver/s);
});

test.after(() => rmSync(pkg, { recursive: true, force: true }));
test.run();
