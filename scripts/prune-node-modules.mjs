#!/usr/bin/env node
// Copies the daemon's runtime dependencies (and theirs, nothing else) from node_modules to a
// folder small enough to ship (`npm run bundle`) or carry to a GPU host (the device call's tree
// must stay under 64 MiB):
// no mermaid (the inspect page resolves it lazily, only when /statechart is served), no
// typescript, playwright-core, @types or build-only packages; type declarations, source maps,
// markdown and zod's TypeScript sources are dropped. On the GPU host: ln -sfn .device/nm node_modules
//   node scripts/prune-node-modules.mjs [DEST]        (default .device/nm; about 12 MB)
import { cpSync, existsSync, readdirSync, readFileSync, rmSync, statSync, unlinkSync } from 'node:fs';
import { dirname, join, relative, resolve as resolvePath } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const dest = resolvePath(root, process.argv[2] ?? '.device/nm');
// What dist/ imports at run time: package.json's dependencies less those only the build uses
// (and mermaid, of which the bundle ships one file), so a new dependency cannot be forgotten here.
const BUILD_ONLY = new Set(['cmake-js', 'node-addon-api', 'node-api-headers', 'mermaid']);
const RUNTIME = Object.keys(JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).dependencies).filter((d) => !BUILD_ONLY.has(d));
const modules = join(root, 'node_modules');

function resolve(name, from) {
  for (let d = from; ; d = dirname(d)) {
    const p = join(d, 'node_modules', name);
    if (existsSync(join(p, 'package.json'))) return p;
    if (dirname(d) === d) return null;
  }
}
const seen = new Set();
function visit(dir) {
  if (seen.has(dir)) return;
  seen.add(dir);
  const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  for (const dep of Object.keys({ ...pkg.dependencies, ...pkg.optionalDependencies })) {
    const p = resolve(dep, dir);
    if (p) visit(p);
    else if (!pkg.optionalDependencies?.[dep]) throw new Error(`${dep}, needed by ${dir}, is not installed`);
  }
}
for (const name of RUNTIME) {
  const p = resolve(name, root);
  if (!p) throw new Error(`${name} is not installed: run npm ci`);
  visit(p);
}
rmSync(dest, { recursive: true, force: true });
// Parents before their nested node_modules; each copy leaves out its own nested node_modules,
// which the walk copies separately (only what is needed).
for (const dir of [...seen].sort()) {
  cpSync(dir, join(dest, relative(modules, dir)), { recursive: true, filter: (src) => !/[/\\]node_modules$/.test(relative(dir, src)) });
}
rmSync(join(dest, 'zod', 'src'), { recursive: true, force: true });
const DROP = /\.(d\.ts|d\.cts|d\.mts|map|md|ts)$/;
let bytes = 0;
(function strip(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    const s = statSync(p);
    if (s.isDirectory()) strip(p);
    else if (DROP.test(name)) unlinkSync(p);
    else bytes += s.size;
  }
})(dest);
console.log(`${seen.size} packages, ${(bytes / 2 ** 20).toFixed(1)} MiB in ${relative(root, dest)}`);
