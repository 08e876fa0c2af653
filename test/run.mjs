#!/usr/bin/env node
// Runs every compiled test file (dist/test/**/*.test.js) in its own process, so one file's
// crash or leaked handle cannot hide another's result, and prints the closing line CI reads:
// "N passed, N failed, N skipped", after a summary of why each skip happened: a uvu file says it
// in a line "SKIPPED: why", pytest in its -rs report. Exits non-zero on any failure and when no
// test ran.
// The Python client's pytest suite runs as one more job, each of its tests counted alike; every
// Python the tests start is WEIGHTD_PYTHON, the project's venv (scripts/python-venv.mjs) unless
// the caller names another.
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { cpus, tmpdir } from 'node:os';
import { ensurePythonVenv } from '../scripts/python-venv.mjs';
import { uvuNodeArgs } from './uvuNodeArgs.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));
const testDir = join(root, 'dist', 'test');
const filter = process.argv[2] ? new RegExp(process.argv[2]) : null;

function walk(dir) {
  let out = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out = out.concat(walk(p));
    else if (name.endsWith('.test.js')) out.push(p);
  }
  return out;
}

function uvuCounts(out) {
  const num = (label) => Number((out.match(new RegExp(`${label}:\\s+(\\d+)`)) || [])[1] || 0);
  // uvu counts skipped tests outside its Total.
  return { ok: num('Passed'), bad: num('Total') - num('Passed'), skip: num('Skipped') };
}

/** Why the tests of one job's output were skipped: uvu files' "SKIPPED: why" lines, pytest's -rs lines. */
function skipReasons(out) {
  const uvu = [...out.matchAll(/^SKIPPED: (.*)$/gm)].map((m) => m[1]);
  // pytest -rs: "SKIPPED [2] clients/python/tests/test_x.py:12: why".
  const pytest = [...out.matchAll(/^SKIPPED \[(\d+)\] ([^:]+:\d+): (.*)$/gm)].map((m) => `${m[3]} (${m[1]}, ${m[2]})`);
  return [...uvu, ...pytest];
}

function pytestCounts(out) {
  // The closing summary, e.g. "1 failed, 4 passed, 1 skipped in 0.31s".
  const summary = out.split('\n').filter((l) => /\bin \d+(\.\d+)?s\b/.test(l)).pop() ?? '';
  const num = (label) => Number((summary.match(new RegExp(`(\\d+) ${label}`)) || [])[1] || 0);
  return { ok: num('passed'), bad: num('failed') + num('errors?'), skip: num('skipped') };
}

const pytestName = 'clients/python/tests (pytest)';
let jobs;
try {
  jobs = walk(testDir)
    .map((f) => ({ name: relative(testDir, f), cmd: process.execPath, args: [...uvuNodeArgs, f], counts: uvuCounts }))
    .filter((job) => !filter || filter.test(job.name));
} catch (err) {
  console.error(`cannot list ${testDir}: ${err.message}; run "npm run build" first`);
  console.log('0 passed, 1 failed');
  process.exit(1);
}

try {
  process.env.WEIGHTD_PYTHON ||= ensurePythonVenv();
} catch (err) {
  console.error(err.message);
  console.log('0 passed, 1 failed');
  process.exit(1);
}
// The vLLM plugin's test needs vLLM, whose torch pin differs from the main venv's: it runs in
// a venv of its own (.venv-vllm, clients/python/requirements-vllm.txt) and only there.
const vllmTest = join(root, 'clients/python/tests/test_vllm_plugin.py');
const vllmName = 'clients/python/tests/test_vllm_plugin.py (pytest, .venv-vllm)';
// Each pytest run gets a base temp dir of its own: in the shared default (/tmp/pytest-of-USER) a
// starting pytest deletes older runs' dirs, so suites running at once broke each other's files.
const pytestTemps = [];
const basetemp = () => `--basetemp=${pytestTemps[pytestTemps.push(mkdtempSync(join(tmpdir(), 'weightd-pytest-'))) - 1]}`;
if (!filter || filter.test(pytestName)) {
  jobs.push({
    name: pytestName,
    cmd: process.env.WEIGHTD_PYTHON,
    args: ['-m', 'pytest', '-q', '-rs', '-p', 'no:cacheprovider', basetemp(), `--ignore=${vllmTest}`, join(root, 'clients/python/tests')],
    counts: pytestCounts,
  });
}
// The Python jobs are the longest: they start first, so the suite's wall time is not their tail.
if (!filter || filter.test(vllmName)) {
  let python;
  try {
    python = process.env.WEIGHTD_VLLM_PYTHON || ensurePythonVenv({
      venvDir: join(root, '.venv-vllm'),
      requirements: join(root, 'clients/python/requirements-vllm.txt'),
      smoke: 'import torch, vllm, transformers, xxhash, rfc8785, pytest\nassert torch.__version__.startswith("2.13.0")',
    });
  } catch (err) {
    console.error(err.message);
    console.log('0 passed, 1 failed');
    process.exit(1);
  }
  jobs.push({ name: vllmName, cmd: python, args: ['-m', 'pytest', '-q', '-rs', '-p', 'no:cacheprovider', basetemp(), vllmTest], counts: pytestCounts });
}
jobs.sort((a, b) => Number(b.cmd !== process.execPath) - Number(a.cmd !== process.execPath));

const parallel = Math.max(1, Math.min(Number(process.env.WEIGHTD_TEST_JOBS) || cpus().length, 4));
let passed = 0, failed = 0, skipped = 0;
const failedFiles = [];
const skips = [];

function runJob({ name, cmd, args, counts }) {
  return new Promise((resolve) => {
    const started = Date.now();
    const child = spawn(cmd, args, {
      cwd: root,
      env: { ...process.env, FORCE_COLOR: '0', NO_COLOR: '1', PYTHONDONTWRITEBYTECODE: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    child.on('error', (err) => (out += `cannot start ${cmd}: ${err.message}\n`));
    child.on('close', (code, signal) => {
      let { ok, bad, skip } = counts(out);
      if ((code !== 0 || signal) && bad === 0) bad = 1; // crashed outside a test, or never ran one
      passed += ok; skipped += skip; failed += bad;
      if (skip > 0) {
        const why = skipReasons(out);
        skips.push(...(why.length > 0 ? why : [`${skip} test(s): no reason given`]).map((w) => `${name}: ${w}`));
      }
      const secs = ((Date.now() - started) / 1000).toFixed(1);
      if (bad > 0) {
        failedFiles.push(name);
        process.stdout.write(`FAIL ${name} (${secs}s, exit ${signal ?? code})\n${out}\n`);
      } else {
        process.stdout.write(`ok   ${name} (${ok} passed${skip ? `, ${skip} skipped` : ''}, ${secs}s)\n`);
      }
      resolve();
    });
  });
}

const queue = [...jobs];
await Promise.all(Array.from({ length: parallel }, async () => {
  while (queue.length) await runJob(queue.shift());
}));

for (const dir of pytestTemps) rmSync(dir, { recursive: true, force: true });
if (failedFiles.length) console.log(`\nfailed files:\n  ${failedFiles.join('\n  ')}`);
if (skips.length) console.log(`\nskipped:\n  ${skips.join('\n  ')}`);
if (passed + failed === 0) failed = 1, console.log('no test ran');
console.log(`${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exit(failed > 0 ? 1 : 0);
