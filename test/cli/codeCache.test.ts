// dist/launch.cjs (scripts/launch-main.cjs) runs the bundle with the code cache the build made
// (scripts/code-cache.mjs) where it matches, and compiles the bundle from its source where it does
// not: a cache for another Node.js, another bundle, a corrupt or truncated one, one V8 refuses.
// Each case runs in a copy of dist/'s launcher, bundle and cache (the rest linked to the
// checkout), so a test may break its cache without touching the one the other tests run.
// WEIGHTD_CODE_CACHE_DEBUG=1 makes the launcher say which it did.
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, readFileSync, readdirSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel, freshSocketDir, freshTempDir, repoRoot } from '../helpers/paths.js';

const version = (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string }).version;
const nodeFlags = readFileSync(join(repoRoot, 'scripts/node-flags'), 'utf8')
  .split('\n')
  .filter((l) => l.trim() !== '' && !l.startsWith('#'));
const builtCache = readFileSync(join(repoRoot, 'dist/main.cjs.codecache'));

/** A checkout whose dist/ holds copies of the launcher, the bundle and `cache` (none: absent); the rest (src, the rank thread's bundle) linked. */
function layout(cache: Buffer | undefined, bundle = readFileSync(join(repoRoot, 'dist/main.cjs'))): string {
  const root = freshTempDir();
  for (const linked of ['node_modules', 'build', 'scripts', 'examples', 'package.json']) symlinkSync(join(repoRoot, linked), join(root, linked));
  mkdirSync(join(root, 'dist'));
  symlinkSync(join(repoRoot, 'dist/src'), join(root, 'dist/src'));
  symlinkSync(join(repoRoot, 'dist/rank-thread.cjs'), join(root, 'dist/rank-thread.cjs'));
  copyFileSync(join(repoRoot, 'dist/launch.cjs'), join(root, 'dist/launch.cjs'));
  copyFileSync(join(repoRoot, 'weightd'), join(root, 'weightd'));
  writeFileSync(join(root, 'dist/main.cjs'), bundle);
  if (cache) writeFileSync(join(root, 'dist/main.cjs.codecache'), cache);
  return root;
}

/** `weightd --version` through the layout's launcher (./weightd, so with scripts/node-flags): what the launcher said of its cache. */
function versionRun(root: string): string {
  const r = spawnSync(join(root, 'weightd'), ['--version'], { encoding: 'utf8', env: { ...process.env, WEIGHTD_CODE_CACHE_DEBUG: '1' } });
  assert.is(r.status, 0, r.stderr);
  assert.is(r.stdout.trim(), version);
  return /^weightd: code cache \S+: (.*)$/m.exec(r.stderr)?.[1] ?? `nothing said: ${r.stderr}`;
}

/** The built cache with its first line's `field=` replaced, the rest kept. */
function withField(field: string, value: string): Buffer {
  const end = builtCache.indexOf(10);
  const line = builtCache.toString('latin1', 0, end).replace(new RegExp(`${field}=\\S+`), `${field}=${value}`);
  return Buffer.concat([Buffer.from(`${line}\n`, 'latin1'), builtCache.subarray(end + 1)]);
}

test("the build's cache is used, and the launcher writes nothing", () => {
  const root = layout(builtCache);
  const before = statSync(join(root, 'dist/main.cjs.codecache')).mtimeMs;
  assert.is(versionRun(root), 'used');
  assert.equal(readdirSync(join(root, 'dist')).sort(), ['launch.cjs', 'main.cjs', 'main.cjs.codecache', 'rank-thread.cjs', 'src']);
  assert.is(statSync(join(root, 'dist/main.cjs.codecache')).mtimeMs, before);
});

test('the bundle is ASCII, so that Node reads it into a one-byte string', () => {
  const bundle = readFileSync(join(repoRoot, 'dist/main.cjs'));
  const at = bundle.findIndex((b) => b > 0x7f);
  assert.is(at, -1, `a byte over 0x7f at ${at}: ${bundle.subarray(Math.max(0, at - 40), at + 10).toString('utf8')}`);
});

test('a daemon started with the cache serves', async () => {
  const root = layout(builtCache);
  await servesWithCache(root, 'used');
});

test('no cache: the bundle is compiled from its source', () => {
  assert.match(versionRun(layout(undefined)), /^not used: unreadable \(ENOENT\)$/);
});

test("a cache for another Node.js, another bundle or another payload is not used", () => {
  assert.match(versionRun(layout(withField('node', 'v19.0.0'))), /^not used: made for another/);
  assert.match(versionRun(layout(withField('arch', 'arm64'))), /^not used: made for another/);
  // Another bundle of the same length, which V8 itself would take the cache for (it checks only
  // the source's length): a letter of its first comment changed.
  const other = Buffer.from(readFileSync(join(repoRoot, 'dist/main.cjs')));
  const at = other.indexOf('// ') + 3;
  other[at] = other[at] === 0x78 ? 0x79 : 0x78;
  assert.match(versionRun(layout(builtCache, other)), /^not used: made for another/);
  assert.match(versionRun(layout(withField('payload', '0'.repeat(64)))), /^not used: made for another/);
});

test('a corrupt or truncated cache is not used', () => {
  const flipped = Buffer.from(builtCache);
  flipped[flipped.length - 100] ^= 0xff;
  assert.match(versionRun(layout(flipped)), /^not used: made for another/);
  assert.match(versionRun(layout(builtCache.subarray(0, builtCache.length - 1000))), /^not used: made for another/);
  assert.match(versionRun(layout(builtCache.subarray(0, 30))), /^not used: made for another/);
  assert.match(versionRun(layout(Buffer.alloc(0))), /^not used: made for another/);
});

test('a cache V8 refuses (made under other flags) is not used, and a daemon still starts and serves', async () => {
  // Made as the build makes it, but without scripts/node-flags: its first line matches, V8's flag check does not.
  const root = layout(undefined);
  const made = join(root, 'dist/main.cjs.codecache');
  const r = spawnSync(process.execPath, [join(root, 'dist/launch.cjs'), '--version'], { encoding: 'utf8', env: { ...process.env, WEIGHTD_CODE_CACHE_WRITE: made } });
  assert.is(r.status, 0, r.stderr);
  assert.is(versionRun(root), 'not used: rejected by V8');
  await servesWithCache(root, 'not used: rejected by V8');
});

/** A daemon of `root`'s launcher (with scripts/node-flags) to READY, `ctl list` against it, and what it said of its cache. */
async function servesWithCache(root: string, said: string) {
  const socketDir = freshSocketDir();
  const env = { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} ${nodeFlags.join(' ')}`, WEIGHTD_CODE_CACHE_DEBUG: '1' };
  const daemon = await startDaemon({ model: exampleModel, socketDir, script: join(root, 'dist/launch.cjs'), env });
  try {
    assert.match(daemon.stderr(), `weightd: code cache ${join(root, 'dist/main.cjs.codecache')}: ${said}\n`);
    const list = spawnSync(join(root, 'weightd'), ['ctl', 'list', '--weight-cache-socket-dir', socketDir], { encoding: 'utf8' });
    assert.is(list.status, 0, list.stderr);
    assert.match(list.stdout, /^tiny-llama \(own\) {2}v0 {2}serving /m);
  } finally {
    assert.equal(await daemon.stop(), { code: 0, signal: null }, daemon.stderr().slice(-2000));
  }
}

test.run();
