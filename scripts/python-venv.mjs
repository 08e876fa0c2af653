#!/usr/bin/env node
// The tests' Python: a virtualenv at <repo>/.venv with the pins of
// clients/python/requirements-test.txt and clients/python installed into it as a package, as an
// engine's environment has it. Created on first use, reused afterwards, rebuilt from scratch
// when the pins or the base interpreter change or when a previous build never finished.
//
//   node scripts/python-venv.mjs     ensure it, print its python's path
//   import { ensurePythonVenv } ...  the same from test/run.mjs
//
// Downloaded wheels are kept outside the repository (WEIGHTD_WHEEL_CACHE, default
// ${XDG_CACHE_HOME:-~/.cache}/weightd/wheels), so a fresh clone on the same machine installs
// offline. The base interpreter is `python3` on PATH, or WEIGHTD_VENV_BASE_PYTHON.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const clientDir = join(root, 'clients/python');
const requirements = join(clientDir, 'requirements-test.txt');
export const venvDir = join(root, '.venv');
export const venvPython = join(venvDir, 'bin/python');
// Written last, each after the step it vouches for succeeded: a venv without a matching stamp is
// a half-built one (an interrupted install) and is redone.
const requirementsStamp = join(venvDir, '.weightd-requirements');
const clientStamp = join(venvDir, '.weightd-client');

// What the tests rely on, checked before the venv is declared complete: the lock installs with
// --no-deps, so a missing dependency shows up here and not in the middle of the suite.
const SMOKE = [
  'import numpy, torch, transformers, pytest',
  'x = torch.arange(6, dtype=torch.float32).reshape(2, 3)',
  'assert (x @ x.T).sum().item() == 83.0',
  'assert numpy.asarray(x).sum() == 15.0',
].join('\n');

function run(cmd, args, what) {
  const r = spawnSync(cmd, args, { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] });
  if (r.error || r.status !== 0) {
    const why = r.error ? r.error.message : `exit ${r.signal ?? r.status}`;
    throw new Error(`python venv: ${what} failed (${cmd} ${args.join(' ')}: ${why})`);
  }
}

function output(cmd, args) {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
}

function readStamp(path) {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return null;
  }
}

function sha256(parts) {
  const h = createHash('sha256');
  for (const p of parts) h.update(p).update('\0');
  return h.digest('hex');
}

/** The client package's installable files (not its tests, nor build leftovers). */
function clientFiles(dir = clientDir) {
  let out = [];
  for (const name of readdirSync(dir).sort()) {
    if (name === 'tests' || name === 'build' || name === '__pycache__' || name.endsWith('.egg-info')) continue;
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out = out.concat(clientFiles(p));
    else out.push(p);
  }
  return out;
}

function buildVenv(base, log) {
  log(`python venv: creating ${relative(root, venvDir)} from ${base} (pins: ${relative(root, requirements)}; first run downloads ~2.4 GB)`);
  rmSync(venvDir, { recursive: true, force: true });
  run(base, ['-m', 'venv', venvDir], `"${base} -m venv" (on Debian: apt-get install python3-venv)`);
  const cache = process.env.WEIGHTD_WHEEL_CACHE || join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'weightd/wheels');
  mkdirSync(cache, { recursive: true });
  const pip = [venvPython, '-m', 'pip', '--quiet', '--disable-pip-version-check'];
  // Wheels already in the cache are not fetched again; the install itself then reads only it.
  run(pip[0], [...pip.slice(1), 'download', '--no-deps', '--dest', cache, '-r', requirements], 'downloading the pinned wheels');
  run(pip[0], [...pip.slice(1), 'install', '--no-deps', '--no-index', '--find-links', cache, '-r', requirements], 'installing the pinned wheels');
  run(venvPython, ['-c', SMOKE], 'the smoke test of the installed packages');
}

function installClient(log) {
  // A copy, because setuptools builds in the source tree, and a stale build/ there would
  // install modules that no longer exist.
  const copy = mkdtempSync(join(tmpdir(), 'weightd-client-'));
  try {
    cpSync(clientDir, copy, { recursive: true, filter: (src) => !/(^|\/)(build|__pycache__|[^/]*\.egg-info)$/.test(relative(clientDir, src)) });
    log('python venv: installing clients/python into it');
    run(venvPython, ['-m', 'pip', '--quiet', 'install', '--no-deps', '--no-index', '--no-build-isolation', '--force-reinstall', copy], 'installing clients/python');
  } finally {
    rmSync(copy, { recursive: true, force: true });
  }
}

/** Makes sure .venv is complete and current; returns its python. */
export function ensurePythonVenv({ log = (line) => process.stderr.write(`${line}\n`) } = {}) {
  const base = process.env.WEIGHTD_VENV_BASE_PYTHON || 'python3';
  const version = output(base, ['-c', 'import sys; print(sys.version)']);
  if (version === null) throw new Error(`python venv: cannot run ${base}; install Python 3.11 or set WEIGHTD_VENV_BASE_PYTHON`);
  const wantRequirements = sha256([readFileSync(requirements), version]);
  if (readStamp(requirementsStamp) !== wantRequirements || !existsSync(venvPython)) {
    buildVenv(base, log);
    writeFileSync(requirementsStamp, wantRequirements);
  }
  const files = clientFiles();
  const wantClient = sha256(files.flatMap((f) => [relative(clientDir, f), readFileSync(f)]));
  if (readStamp(clientStamp) !== wantClient) {
    installClient(log);
    writeFileSync(clientStamp, wantClient);
  }
  return venvPython;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  try {
    console.log(ensurePythonVenv());
  } catch (err) {
    console.error(err.message);
    process.exit(1);
  }
}
