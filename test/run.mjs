#!/usr/bin/env node
// Runs every compiled test file (dist/test/**/*.test.js) in its own process, so one file's
// crash or leaked handle cannot hide another's result, and prints the closing line CI reads:
// "N passed, N failed, N skipped". Exits non-zero on any failure and when no test ran.
import { spawn } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { cpus } from 'node:os';

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

let files;
try {
  files = walk(testDir).filter((f) => !filter || filter.test(relative(testDir, f)));
} catch (err) {
  console.error(`cannot list ${testDir}: ${err.message}; run "npm run build" first`);
  console.log('0 passed, 1 failed');
  process.exit(1);
}

const parallel = Math.max(1, Math.min(Number(process.env.WEIGHTD_TEST_JOBS) || cpus().length, 4));
let passed = 0, failed = 0, skipped = 0;
const failedFiles = [];

function runFile(file) {
  return new Promise((resolve) => {
    const started = Date.now();
    // --expose-gc lets tests of finalizers (native mappings) force a collection.
    const child = spawn(process.execPath, ['--expose-gc', file], {
      cwd: root,
      env: { ...process.env, FORCE_COLOR: '0', NO_COLOR: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    child.on('close', (code, signal) => {
      const num = (label) => Number((out.match(new RegExp(`${label}:\\s+(\\d+)`)) || [])[1] || 0);
      const total = num('Total'), ok = num('Passed'), skip = num('Skipped');
      const name = relative(testDir, file);
      // uvu counts skipped tests outside its Total.
      let bad = total - ok;
      if ((code !== 0 || signal) && bad === 0) bad = 1; // crashed outside a test, or never ran one
      passed += ok; skipped += skip; failed += bad;
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

const queue = [...files];
await Promise.all(Array.from({ length: parallel }, async () => {
  while (queue.length) await runFile(queue.shift());
}));

if (failedFiles.length) console.log(`\nfailed files:\n  ${failedFiles.join('\n  ')}`);
if (passed + failed === 0) failed = 1, console.log('no test ran');
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
process.exit(failed > 0 ? 1 : 0);
