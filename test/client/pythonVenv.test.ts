// scripts/python-venv.mjs, the tests' Python environment: built once, reused, rebuilt when a
// build never finished or the pins changed, and the client package reinstalled when its sources
// change. On a small venv of its own (setuptools only), so it takes seconds, not minutes.
import { spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { repoRoot } from '../helpers/paths.js';

interface VenvOptions { venvDir: string; requirements: string; smoke?: string; log?: (line: string) => void; freeBytes?: (dir: string) => number }
const { ensurePythonVenv } = (await import(pathToFileURL(join(repoRoot, 'scripts/python-venv.mjs')).href)) as {
  ensurePythonVenv: (o: VenvOptions) => string;
};

const dir = mkdtempSync(join(tmpdir(), 'weightd-venv-test-'));
const venvDir = join(dir, 'venv');
const requirements = join(dir, 'requirements.txt');
// The one pin the lock has that installing clients/python needs (bdist_wheel is built in).
writeFileSync(requirements, 'setuptools==84.2.1\n');
const builds: string[] = [];
const options = { venvDir, requirements, smoke: 'import setuptools', log: (line: string) => builds.push(line) };
/** A file inside the venv that only a rebuild removes. */
const marker = join(venvDir, 'marker');

function importsClient(python: string): string {
  const r = spawnSync(python, ['-c', 'import weightd_client, sys; print(weightd_client.__file__)'], { cwd: dir, encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  return r.stdout.trim();
}

test.after(() => rmSync(dir, { recursive: true, force: true }));

test('first use builds the venv with the client installed; later uses reuse it', () => {
  const python = ensurePythonVenv(options);
  assert.is(python, join(venvDir, 'bin/python'));
  // It says where the wheels come from and how big they are (the machine's wheel cache holds
  // this pin once the tests' own venv was made), then that it is done.
  assert.match(builds[0]!, /^python venv: creating \S+ from \S+ with the 1 pins of \S+requirements\.txt: every wheel is in the cache \S+ \(0\.\d\d GB\), nothing to download$/);
  assert.ok(builds.some((l) => /^python venv: \S+ ready in \d+ s$/.test(l)), builds.join('\n'));
  assert.match(importsClient(python), join(venvDir, 'lib'), 'the installed package, not the source tree');
  writeFileSync(marker, '');
  builds.length = 0;
  ensurePythonVenv(options);
  assert.equal(builds, [], 'nothing rebuilt or reinstalled');
  assert.ok(existsSync(marker));
});

test('a build that never wrote its stamp (interrupted, or its smoke test failed) is redone', () => {
  appendFileSync(requirements, '# changed pins: a build starts\n');
  assert.throws(() => ensurePythonVenv({ ...options, smoke: 'raise SystemExit(3)' }), /smoke test/);
  writeFileSync(marker, '');
  ensurePythonVenv(options);
  assert.not.ok(existsSync(marker), 'the half-built venv was deleted and built again');
  importsClient(join(venvDir, 'bin/python'));
});

test('changed pins rebuild it', () => {
  writeFileSync(marker, '');
  appendFileSync(requirements, '# a comment changes the pins file too\n');
  ensurePythonVenv(options);
  assert.not.ok(existsSync(marker));
});

test('a file system with too little room for the packages is refused by name before pip starts, and the next run with room builds', () => {
  appendFileSync(requirements, '# changed pins: a build starts\n');
  const asked: string[] = [];
  const full = (at: string) => (asked.push(at), 1e6);
  assert.throws(() => ensurePythonVenv({ ...options, freeBytes: full }), /^python venv: installing 1 packages into \S+ takes about 0\.\d\d GB, but its file system has 0\.00 GB free; free some space/);
  assert.equal(asked, [venvDir]);
  const sitePackages = readdirSync(join(venvDir, 'lib')).map((v) => join(venvDir, 'lib', v, 'site-packages'));
  // A fresh venv may bring a setuptools of its own; the pinned one is not installed.
  assert.ok(sitePackages.length > 0 && sitePackages.every((d) => existsSync(d) && !existsSync(join(d, 'setuptools-84.2.1.dist-info'))), 'the venv was made, and nothing installed into it');
  importsClient(ensurePythonVenv(options));
});

test.run();
