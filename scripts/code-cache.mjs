// dist/main.cjs.codecache: the V8 code cache that dist/launch.cjs (scripts/launch-main.cjs) reads
// to start the bundle without compiling it. Made here, at build time, because the daemon never
// writes one: the install directory may be read-only (deploy/systemd's sandbox).
//
// A cache taken right after compiling holds only what V8 compiles eagerly, little of a start
// (bench/RESULTS.md, issue 33); so it is taken at the exit of a real start: a daemon on
// examples/tiny-llama (host backend) to READY and its stop, the path a restart takes too. Run
// with scripts/node-flags, as the launchers run it: V8 rejects a cache made under other flags.
// NODE_OPTIONS is left out for the same reason. Without the addon (build:native not run yet), or
// where the daemon cannot start here, there is no cache, and the launcher compiles the bundle
// from its source: a warning, not a failed build (test/cli/codeCache checks a build has one).
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const cache = join(root, 'dist/main.cjs.codecache');
rmSync(cache, { force: true });
if (!existsSync(join(root, 'build/Release/weightd.node'))) {
  console.warn('code-cache: build/Release/weightd.node is missing (npm run build:native), so dist/main.cjs gets no code cache');
  process.exit(0);
}
const flags = readFileSync(join(root, 'scripts/node-flags'), 'utf8').split('\n').filter((l) => l.trim() !== '' && !l.startsWith('#'));
const work = mkdtempSync(join(tmpdir(), 'weightd-code-cache-'));
try {
  const made = `${cache}.${process.pid}`; // renamed into place once whole
  const daemon = spawn(process.execPath, [...flags, join(root, 'dist/launch.cjs'), '--model', join(root, 'examples/tiny-llama'), '--device', 'host', '--weight-cache-socket-dir', work], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, NODE_OPTIONS: '', WEIGHTD_HOST_DEVICES: `code-cache-${process.pid}`, WEIGHTD_CODE_CACHE_WRITE: made, WEIGHTD_CODE_CACHE_DEBUG: '' },
  });
  let log = '';
  daemon.stderr.setEncoding('utf8').on('data', (d) => {
    if (!log.includes('"ready":true') && (log += d).includes('"ready":true')) daemon.kill('SIGTERM');
  });
  const code = await new Promise((done) => daemon.on('close', done));
  if (code === 0 && log.includes('"ready":true')) renameSync(made, cache);
  else console.warn(`code-cache: the daemon on the example exited ${code} ${log.includes('"ready":true') ? 'after' : 'before'} READY, so dist/main.cjs gets no code cache:\n${log}`);
} finally {
  rmSync(`${cache}.${process.pid}`, { force: true });
  rmSync(work, { recursive: true, force: true });
}
