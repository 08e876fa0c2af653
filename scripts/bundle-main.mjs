// dist/main.cjs: the command line and the daemon's main thread as one file, which the launchers
// run (./weightd, the bundle's bin/weightd). Node 20 loads the ~300 ES modules of dist/main.js one
// file at a time, with no compile cache: one CommonJS file starts in half the time
// (bench/RESULTS.md, issue 33). dist/main.js stays the unbundled entry that the tests run.
//
// Each module keeps its own import.meta: the URL its file has under dist/src/, so the paths it
// makes relative to itself (the addon, the keeper binary, the worker threads' files, package.json)
// name the same files as unbundled. A rank's thread runs dist/rank-thread.cjs, bundled the same
// way; other worker threads (piscina's) load dist/src/ as ES modules.
// Packages that find files beside their own (piscina's workers, the addon loaders) and those
// loaded on demand through createRequire stay in node_modules; the rest are pure code. pino is
// bundled with the packages it requires: what it would find beside itself is a transport's worker,
// and the daemon writes its log in-process, with no transport.
// dist/launch.cjs, which the launchers run, runs the bundle with a code cache (scripts/launch-main.cjs).
import { build } from 'esbuild';
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { relative } from 'node:path';

const dist = fileURLToPath(new URL('../dist/', import.meta.url));
const BUNDLED_PACKAGES = ['zod', 'xstate', 'commander', 'pino'];
/** The oldest Node.js package.json's engines admit ("^20.17.0 || ..."): what the bundle's syntax must run on. */
const oldestNode = /\d+\.\d+/.exec(JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).engines.node)[0];

/**
 * `import.meta` of the module at `rel` (from dist/), as Node gives it to that file unbundled. A
 * function declaration at the end (hoisted), so that the file's "use strict" stays its first line.
 */
const IMPORT_META = `
function __weightdImportMeta(rel) {
  const filename = require('node:path').join(__dirname, rel);
  const url = require('node:url').pathToFileURL(filename).href;
  const resolve = (specifier) => require('node:url').pathToFileURL(require('node:module').createRequire(url).resolve(specifier)).href;
  return { url, filename, dirname: require('node:path').dirname(filename), resolve };
}`;

// The planning code's digest (src/keeper/keptPlan.ts, plannerDigest), taken now from the compiled
// modules this bundle is made of, so that a start does not read and hash them again (~4 ms of a
// restart that adopts on the development VM, bench/RESULTS.md, issue 33).
const { plannerDigest } = await import(`${dist}src/keeper/keptPlan.js`);

/** The rank thread's own bundle, beside main.cjs: what the bundled daemon's rank threads run (src/actors/rankWorkerModules.ts, WorkerRegistry). */
const RANK_THREAD_BUNDLE = 'rank-thread.cjs';

/** Bundles `entry` (a compiled module under dist/src/) into dist/`outfile`, one CommonJS file of ASCII. */
async function bundle(entry, outfile, define) {
  await build({
    entryPoints: [`${dist}${entry}`],
    outfile: `${dist}${outfile}`,
    bundle: true,
    platform: 'node',
    format: 'cjs',
    // Function names are data here: xstate's and()/or()/not() guards are drawn by name (machineToMermaid).
    keepNames: true,
    target: `node${oldestNode}`,
    footer: { js: IMPORT_META },
    define,
    logLevel: 'warning',
    plugins: [
      {
        name: 'weightd-externals-and-import-meta',
        setup(b) {
          b.onResolve({ filter: /^[^./]/ }, (args) => {
            const pkg = args.path.startsWith('@') ? args.path.split('/').slice(0, 2).join('/') : args.path.split('/')[0];
            // A bundled package's own imports are bundled with it.
            const fromBundled = args.importer.includes('/node_modules/');
            return args.path.startsWith('node:') || !(BUNDLED_PACKAGES.includes(pkg) || fromBundled) ? { path: args.path, external: true } : undefined;
          });
          b.onLoad({ filter: /\/dist\/src\/.*\.js$/ }, async (args) => {
            const source = await readFile(args.path, 'utf8');
            return { contents: source.replaceAll('import.meta', `__weightdImportMeta(${JSON.stringify(relative(dist, args.path))})`), loader: 'js' };
          });
        },
      },
    ],
  });
  // ASCII only: esbuild escapes every other character of the code (its default charset), but not
  // of the comments it keeps (a few, from the packages: typographic quotes, a dash). One such
  // character makes Node decode the whole 1.9 MB as UTF-8 into a two-byte string that V8 then
  // scans: ~10 ms more of each start than ASCII (bench/RESULTS.md, issue 33). Written as
  // \u{...}, which means the same character wherever else JavaScript could hold it.
  const bundled = readFileSync(`${dist}${outfile}`, 'utf8');
  writeFileSync(`${dist}${outfile}`, bundled.replace(/[^\x00-\x7f]/gu, (c) => `\\u{${c.codePointAt(0).toString(16)}}`));
}

await bundle('src/main.js', 'main.cjs', {
  __BUNDLED_PLANNER_DIGEST__: JSON.stringify(plannerDigest(`${dist}src/`)),
  __BUNDLED_RANK_THREAD__: JSON.stringify(RANK_THREAD_BUNDLE),
});
// A warm thread's module and the rank's (src/actors/warmRankWorker.ts imports rankWorker.js when
// it is the rank's module): 3x faster to load than their ES modules (bench/RESULTS.md, issue 33).
await bundle('src/actors/warmRankWorker.js', RANK_THREAD_BUNDLE, {});
copyFileSync(fileURLToPath(new URL('launch-main.cjs', import.meta.url)), `${dist}launch.cjs`);
