// A structural read of src/: every relative import, type-only ones included (they are the edges
// a reader follows, even though tsc erases them), must form a graph without a cycle. The machine
// modules must reach no implementation that loads the addon.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { repoRoot } from '../helpers/paths.js';

const srcDir = join(repoRoot, 'src');

function walk(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? walk(p) : p.endsWith('.ts') ? [p] : [];
  });
}

interface Edge {
  to: string;
  /** `import type` / `export type`: erased by tsc, loads nothing at run time. */
  typeOnly: boolean;
}

/** `from '...'` of import/export statements and `import('...')`; comments are stripped first. */
function importsOf(file: string): Edge[] {
  const text = readFileSync(file, 'utf8').replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');
  const found = [
    ...[...text.matchAll(/^\s*(import|export)\s+(type\s)?[^'"`;]*?\bfrom\s+'([^']+)'/gm)].map((m) => ({ spec: m[3]!, typeOnly: Boolean(m[2]) })),
    ...[...text.matchAll(/^\s*import\s+'([^']+)'/gm), ...text.matchAll(/\bimport\(\s*'([^']+)'\s*\)/g)].map((m) => ({ spec: m[1]!, typeOnly: false })),
  ];
  return found.filter((e) => e.spec.startsWith('.')).map((e) => ({ to: resolve(dirname(file), e.spec.replace(/\.js$/, '.ts')), typeOnly: e.typeOnly }));
}

const edges = new Map(walk(srcDir).map((f) => [f, importsOf(f)]));
const graph = new Map([...edges].map(([f, es]) => [f, es.map((e) => e.to)]));
const name = (f: string) => relative(repoRoot, f);

test('every relative import in src/ names a file that exists', () => {
  for (const [file, deps] of graph) for (const d of deps) assert.ok(graph.has(d), `${name(file)} imports ${name(d)}, which is not a source file`);
});

test('src/ has no import cycle', () => {
  const done = new Set<string>();
  const stack: string[] = [];
  const cycles: string[] = [];
  const visit = (f: string) => {
    const at = stack.indexOf(f);
    if (at >= 0) return void cycles.push([...stack.slice(at), f].map(name).join(' -> '));
    if (done.has(f)) return;
    stack.push(f);
    for (const d of graph.get(f) ?? []) visit(d);
    stack.pop();
    done.add(f);
  };
  for (const f of graph.keys()) visit(f);
  assert.equal(cycles, []);
});

/** Every file a module loads at run time (type-only imports are erased, so they load nothing). */
function loadedBy(entry: string): Set<string> {
  const loaded = new Set<string>();
  const load = (f: string) => {
    if (loaded.has(f)) return;
    loaded.add(f);
    for (const e of edges.get(f) ?? []) if (!e.typeOnly) load(e.to);
  };
  load(entry);
  return loaded;
}

// The machines are drawn by `weightd statechart` and the page without a built addon, and tests
// drive them with their own actors: none may load an actor, native code or an I/O module. Pure
// mappings (src/serve/servedRank.ts) and pure rules (src/rendezvous/checkJoin.ts) are fine.
const machines = readdirSync(join(srcDir, 'machines')).filter((f) => f.endsWith('.ts'));
const io = /^\s*import\s+(?!type\s)[^;]*from\s+'node:(fs|fs\/promises|net|http|worker_threads|child_process|module)'/m;

test('src/machines holds the supervisor and the coordinator machines', () => {
  for (const m of ['supervisor.ts', 'coordinator.ts']) assert.ok(machines.includes(m), `src/machines/${m}`);
});

for (const machine of machines) {
  test(`loading machines/${machine} loads no actor, no native code and no I/O module`, () => {
    const offending = [...loadedBy(join(srcDir, 'machines', machine))].filter((f) => /\/src\/(native|actors)\//.test(f) || io.test(readFileSync(f, 'utf8')));
    assert.equal(offending.map(name), []);
  });
}

test.run();
