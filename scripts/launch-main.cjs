// dist/launch.cjs (scripts/bundle-main.mjs copies it there): what the launchers run (./weightd, the
// bundle's bin/weightd). It runs dist/main.cjs, the bundled command line and daemon, with the V8
// code cache that `npm run build` made for it (scripts/code-cache.mjs): compiling the 1.8 MB
// bundle is most of what a start costs after Node's own (bench/RESULTS.md, issue 33). The cache
// is only read here, never written at run time: the install directory may be read-only (the
// systemd unit's sandbox).
//
// V8 checks a cache's own version and flags, but of the source only its length, and not the
// bytes of its payload: a cache for another bundle of the same length would run that bundle's
// compiled code. So the cache's first line names the Node.js version, the architecture, and the
// SHA-256 of the bundle and of the payload, and a cache whose line does not match, or that V8
// rejects, is ignored: the bundle is compiled from its source, as without a cache.
// WEIGHTD_CODE_CACHE_DEBUG=1 says on stderr which happened.
'use strict';
const { readFileSync, writeFileSync } = require('node:fs');
const { createHash } = require('node:crypto');
const { dirname, join } = require('node:path');
const Module = require('node:module');
const vm = require('node:vm');

/**
 * Whether these arguments look like a daemon that may run on GPUs: they start with a flag (each
 * other command is a word: ctl, keeper, verify...), ask for no help or version, and for no
 * `--device host`. A guess, not the command line's rules (src/cli/parseArgs.ts): main.ts decides
 * what CUDA work runs, and a wrong guess costs only the driver's start on a thread.
 */
function mayRunOnGpus(args) {
  if (args.length === 0 || !args[0].startsWith('-')) return false;
  if (args.some((a) => ['--help', '-h', '--version', '-V'].includes(a))) return false;
  return !args.some((a, i) => a === '--device=host' || (a === '--device' && args[i + 1] === 'host'));
}

// The CUDA driver's start (cuInit: ~100 ms on an H100 host, bench/RESULTS.md, issue 33), begun
// before the bundle loads, on one of libuv's threads: it runs while this file, the bundle and the
// command line load (~40 ms), and the daemon's own probe and warm-up (src/native/cuda.ts) find it
// done, or wait for the rest. A machine without the driver answers in a millisecond; an addon
// that cannot load is the daemon's to report. A command that turns out not to need it (a refused
// flag) still exits with its own code once cuInit returns: process.exit() joins libuv's threads.
if (mayRunOnGpus(process.argv.slice(2))) {
  try {
    void require(join(__dirname, '..', 'build', 'Release', 'weightd.node')).cudaProbe();
  } catch {
    // Reported where the daemon loads the addon (src/native/addon.ts).
  }
}

const bundle = join(__dirname, 'main.cjs');
const cacheFile = `${bundle}.codecache`;
const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex');
const source = readFileSync(bundle);
const bundleHash = sha256(source);
const header = (payload) => `weightd-code-cache node=${process.version} arch=${process.arch} bundle=${bundleHash} payload=${sha256(payload)}\n`;

/** The cache's payload where it was made for this bundle on this Node.js, else why not. */
function matchingCache() {
  let file;
  try {
    file = readFileSync(cacheFile);
  } catch (err) {
    return { why: `unreadable (${err.code ?? err.message})` };
  }
  const end = file.indexOf(10);
  const payload = file.subarray(end + 1);
  if (end < 0 || file.toString('latin1', 0, end + 1) !== header(payload)) return { why: 'made for another Node.js, bundle or payload' };
  return { payload };
}

const cache = process.env.WEIGHTD_CODE_CACHE_WRITE ? { why: 'being made' } : matchingCache();
// A function wrapped as Node wraps a CommonJS module; the hashbang, a comment of the same length.
const text = source.toString('utf8').replace(/^#!/, '//');
const script = new vm.Script(Module.wrap(text), { filename: bundle, cachedData: cache.payload, importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER });
if (process.env.WEIGHTD_CODE_CACHE_DEBUG === '1') {
  const outcome = cache.payload === undefined ? `not used: ${cache.why}` : script.cachedDataRejected ? 'not used: rejected by V8' : 'used';
  process.stderr.write(`weightd: code cache ${cacheFile}: ${outcome}\n`);
}
// scripts/code-cache.mjs: the cache is made at this process's exit, so that it holds every
// function the run compiled, not only those V8 compiles before running.
if (process.env.WEIGHTD_CODE_CACHE_WRITE) {
  process.on('exit', () => {
    const payload = script.createCachedData();
    writeFileSync(process.env.WEIGHTD_CODE_CACHE_WRITE, Buffer.concat([Buffer.from(header(payload), 'latin1'), payload]));
  });
}
const mod = new Module(bundle, null);
mod.filename = bundle;
script.runInThisContext().call(mod.exports, mod.exports, Module.createRequire(bundle), mod, bundle, dirname(bundle));
