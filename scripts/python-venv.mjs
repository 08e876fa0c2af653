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
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statfsSync, statSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const clientDir = join(root, 'clients/python');
// Written last, each after the step it vouches for succeeded: a venv without a matching stamp is
// a half-built one (an interrupted install) and is redone.
const REQUIREMENTS_STAMP = '.weightd-requirements';
const CLIENT_STAMP = '.weightd-client';

// What the tests rely on, checked before the venv is declared complete: the lock installs with
// --no-deps, so a missing dependency shows up here and not in the middle of the suite.
const SMOKE = [
  'import numpy, torch, transformers, pytest',
  'x = torch.arange(6, dtype=torch.float32).reshape(2, 3)',
  'assert (x @ x.T).sum().item() == 83.0',
  'assert numpy.asarray(x).sum() == 15.0',
].join('\n');

function run(cmd, args, what, quiet = false) {
  const r = spawnSync(cmd, args, { cwd: root, stdio: ['ignore', quiet ? 'ignore' : 'inherit', quiet ? 'ignore' : 'inherit'] });
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

/** `name==version` pins of a requirements file. */
function pins(requirements) {
  return readFileSync(requirements, 'utf8')
    .split('\n')
    .map((l) => /^([A-Za-z0-9._-]+)==([^\s;#]+)/.exec(l.trim()))
    .filter(Boolean)
    .map(([, name, version]) => ({ name, version }));
}

/** Which pins the wheel cache already holds (a wheel's file name starts with `name-version-`, name normalised), and their bytes. */
function cacheState(requirements, cache) {
  const files = readdirSync(cache);
  const cached = [];
  const missing = [];
  let bytes = 0;
  for (const pin of pins(requirements)) {
    const prefix = `${pin.name.toLowerCase().replace(/[-_.]+/g, '_')}-${pin.version}-`;
    const file = files.find((f) => f.toLowerCase().replace(/^([^-]+)/, (n) => n.replace(/[-_.]+/g, '_')).startsWith(prefix) && f.endsWith('.whl'));
    if (file) {
      cached.push(pin.name);
      bytes += statSync(join(cache, file)).size;
    } else missing.push(pin.name);
  }
  return { cached, missing, bytes };
}

const gb = (bytes) => `${(bytes / 1e9).toFixed(2)} GB`;
const since = (t) => `${((Date.now() - t) / 1000).toFixed(0)} s`;

/**
 * What pip unpacks a venv's wheels into, per byte of wheel: .venv 4.2 GB from 2.47 GB of wheels,
 * .venv-vllm 6.3 GB from 3.17 GB (2026-12-06); with a margin.
 */
const INSTALLED_PER_WHEEL_BYTE = 2.2;

/** Bytes an unprivileged writer may still use on the file system of `dir`. */
function freeBytesOf(dir) {
  const s = statfsSync(dir);
  return s.bavail * s.bsize;
}

function buildVenv({ venvDir, requirements, smoke, freeBytes }, base, log) {
  const started = Date.now();
  const cache = process.env.WEIGHTD_WHEEL_CACHE || join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'weightd/wheels');
  mkdirSync(cache, { recursive: true });
  const before = cacheState(requirements, cache);
  const total = before.cached.length + before.missing.length;
  log(
    `python venv: creating ${relative(root, venvDir)} from ${base} with the ${total} pins of ${relative(root, requirements)}: ` +
      (before.missing.length === 0
        ? `every wheel is in the cache ${cache} (${gb(before.bytes)}), nothing to download`
        : `${before.cached.length} in the cache ${cache} (${gb(before.bytes)}), ${before.missing.length} to download (${before.missing.join(', ')}; torch alone is GBs)`),
  );
  rmSync(venvDir, { recursive: true, force: true });
  run(base, ['-m', 'venv', venvDir], `"${base} -m venv" (on Debian: apt-get install python3-venv)`);
  const python = join(venvDir, 'bin/python');
  const pip = ['-m', 'pip', '--disable-pip-version-check'];
  const install = [...pip, '--quiet', 'install', '--no-deps', '--no-index', '--find-links', cache, '-r', requirements];
  if (before.missing.length > 0) {
    // pip's own lines show each wheel's size and progress; cached wheels are not fetched again.
    const t = Date.now();
    run(python, [...pip, 'download', '--progress-bar', 'on', '--no-deps', '--dest', cache, '-r', requirements], 'downloading the pinned wheels');
    const after = cacheState(requirements, cache);
    log(`python venv: downloaded ${after.cached.length - before.cached.length} wheels, ${gb(after.bytes - before.bytes)}, in ${since(t)}`);
  }
  // A full disk would fail half way through pip with ENOSPC, after minutes: say so first.
  const need = Math.ceil(INSTALLED_PER_WHEEL_BYTE * cacheState(requirements, cache).bytes);
  const free = freeBytes(venvDir);
  if (free < need) {
    throw new Error(
      `python venv: installing ${total} packages into ${relative(root, venvDir)} takes about ${gb(need)}, but its file system has ${gb(free)} free; ` +
        'free some space (an old clone\'s .venv and .venv-vllm, files under /tmp) and run again',
    );
  }
  log(`python venv: installing ${total} packages from the cache into ${relative(root, venvDir)}`);
  run(python, install, 'installing the pinned wheels from the cache');
  run(python, ['-c', smoke], 'the smoke test of the installed packages');
  log(`python venv: ${relative(root, venvDir)} ready in ${since(started)}`);
}

function installClient(python, log) {
  // Its build backend (clients/python/build_backend) builds from a copy: nothing is written here.
  log('python venv: installing clients/python into it');
  run(python, ['-m', 'pip', '--quiet', 'install', '--no-deps', '--no-index', '--no-build-isolation', '--force-reinstall', clientDir], 'installing clients/python');
}

/**
 * Makes sure the venv is complete and current; returns its python. The options exist for the
 * script's own test; the tests' venv is the default.
 */
export function ensurePythonVenv({
  venvDir = join(root, '.venv'),
  requirements = join(clientDir, 'requirements-test.txt'),
  smoke = SMOKE,
  log = (line) => process.stderr.write(`${line}\n`),
  freeBytes = freeBytesOf,
} = {}) {
  const base = process.env.WEIGHTD_VENV_BASE_PYTHON || 'python3';
  const python = join(venvDir, 'bin/python');
  const version = output(base, ['-c', 'import sys; print(sys.version)']);
  if (version === null) throw new Error(`python venv: cannot run ${base}; install Python 3.11 or set WEIGHTD_VENV_BASE_PYTHON`);
  const wantRequirements = sha256([readFileSync(requirements), version]);
  if (readStamp(join(venvDir, REQUIREMENTS_STAMP)) !== wantRequirements || !existsSync(python)) {
    buildVenv({ venvDir, requirements, smoke, freeBytes }, base, log);
    writeFileSync(join(venvDir, REQUIREMENTS_STAMP), wantRequirements);
  }
  const files = clientFiles();
  const wantClient = sha256(files.flatMap((f) => [relative(clientDir, f), readFileSync(f)]));
  if (readStamp(join(venvDir, CLIENT_STAMP)) !== wantClient) {
    installClient(python, log);
    writeFileSync(join(venvDir, CLIENT_STAMP), wantClient);
  }
  return python;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  try {
    console.log(ensurePythonVenv());
  } catch (err) {
    console.error(err.message);
    process.exit(1);
  }
}
