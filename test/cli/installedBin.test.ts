// The command npm installs (package.json's bin): npm links <prefix>/bin/weightd to the bin file
// and packs it, and running that link must give Node the flags every launcher gives it
// (scripts/node-flags), as ./weightd and the bundle's bin/weightd do. A `node` first on PATH
// records the arguments it is started with, then runs the real one.
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freshTempDir, repoRoot } from '../helpers/paths.js';

const pkg = JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string; bin: Record<string, string> };
const nodeFlags = readFileSync(join(repoRoot, 'scripts/node-flags'), 'utf8')
  .split('\n')
  .filter((l) => l.trim() !== '' && !l.startsWith('#'));

test('the installed weightd command runs the daemon with scripts/node-flags', () => {
  assert.ok(nodeFlags.length > 0, 'scripts/node-flags names at least one flag');
  const dir = freshTempDir();
  const record = join(dir, 'node-args.txt');
  writeFileSync(join(dir, 'node'), `#!/bin/sh\nprintf '%s\\n' "$@" >> '${record}'\nexec '${process.execPath}' "$@"\n`);
  chmodSync(join(dir, 'node'), 0o755);
  // As npm links it into <prefix>/bin.
  const link = join(dir, 'weightd');
  symlinkSync(join(repoRoot, pkg.bin.weightd!), link);
  const r = spawnSync(link, ['--version'], { encoding: 'utf8', env: { ...process.env, PATH: `${dir}:${process.env.PATH}` } });
  assert.is(r.status, 0, r.stderr);
  assert.is(r.stdout.trim(), pkg.version);
  const args = readFileSync(record, 'utf8').trim().split('\n');
  for (const flag of nodeFlags) assert.ok(args.includes(flag), `node got ${flag}: ${args.join(' ')}`);
  assert.is(args.at(-1), '--version', 'and the command line after them');
});

test('./weightd run by its path starts no process before Node: no readlink, dirname or sed (each fork is a millisecond or two of a start)', () => {
  const dir = freshTempDir();
  const record = join(dir, 'forked.txt');
  // Stubs first on PATH: each records its name, then runs the real command.
  for (const tool of ['readlink', 'dirname', 'sed']) {
    const real = spawnSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).stdout.trim();
    writeFileSync(join(dir, tool), `#!/bin/sh\necho ${tool} >> '${record}'\nexec '${real}' "$@"\n`);
    chmodSync(join(dir, tool), 0o755);
  }
  const env = { ...process.env, PATH: `${dir}:${process.env.PATH}` };
  const r = spawnSync(join(repoRoot, pkg.bin.weightd!), ['--version'], { encoding: 'utf8', env });
  assert.is(r.status, 0, r.stderr);
  assert.is(r.stdout.trim(), pkg.version);
  assert.not.ok(existsSync(record), `the launcher ran ${existsSync(record) ? readFileSync(record, 'utf8').trim().split('\n').join(', ') : ''}`);
  // Through a link (npm's bin) it follows the link, which takes readlink.
  const link = join(dir, 'linked-weightd');
  symlinkSync(join(repoRoot, pkg.bin.weightd!), link);
  const linked = spawnSync(link, ['--version'], { encoding: 'utf8', env });
  assert.is(linked.status, 0, linked.stderr);
  assert.ok(readFileSync(record, 'utf8').includes('readlink'), 'a link is followed with readlink');
});

test('the launchers start Node without NODE_EXTRA_CA_CERTS: weightd makes no TLS connection', () => {
  // Node reads the file at its start, before any script, and warns when it cannot.
  const env = { ...process.env, NODE_EXTRA_CA_CERTS: join(freshTempDir(), 'no-such-ca.pem') };
  const shown = spawnSync(process.execPath, ['-e', '0'], { encoding: 'utf8', env });
  assert.match(shown.stderr, /extra certs/, 'Node warns about the missing file: what the launcher must avoid');
  const r = spawnSync(join(repoRoot, pkg.bin.weightd!), ['--version'], { encoding: 'utf8', env });
  assert.is(r.status, 0, r.stderr);
  assert.is(r.stderr, '', 'no certificate read');
});

test('npm packs the bin file and what it runs', () => {
  const r = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: repoRoot, encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  const files = new Set((JSON.parse(r.stdout) as Array<{ files: Array<{ path: string }> }>)[0]!.files.map((f) => f.path));
  for (const f of [pkg.bin.weightd!.replace(/^\.\//, ''), 'scripts/node-flags', 'dist/launch.cjs', 'dist/main.cjs', 'dist/main.cjs.codecache']) assert.ok(files.has(f), `${f} is packed`);
});

test.run();
