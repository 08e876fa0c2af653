// A structural read of src/: every relative import, type-only ones included (they are the edges
// a reader follows, even though tsc erases them), must form a graph without a cycle, and the
// folders must form a layering with the edges listed below. The machine modules must reach no
// implementation that loads the addon.
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
// mappings (src/serve/servedRankData.ts) and pure rules (src/rendezvous/checkJoin.ts) are fine.
const machines = [
  ...readdirSync(join(srcDir, 'machines')).filter((f) => f.endsWith('.ts')).map((f) => `machines/${f}`),
  'models/modelMachine.ts',
  'models/modelRegistryMachine.ts',
  'models/modelGroupMachine.ts',
];
const io = /^\s*import\s+(?!type\s)[^;]*from\s+'node:(fs|fs\/promises|net|http|worker_threads|child_process|module)'/m;

test('src/machines holds the supervisor and the coordinator machines', () => {
  for (const m of ['supervisor.ts', 'coordinator.ts']) assert.ok(machines.includes(`machines/${m}`), `src/machines/${m}`);
});

for (const machine of machines) {
  test(`loading ${machine} loads no actor, no native code and no I/O module`, () => {
    const offending = [...loadedBy(join(srcDir, machine))].filter((f) => /\/src\/(native|actors)\//.test(f) || io.test(readFileSync(f, 'utf8')));
    assert.equal(offending.map(name), []);
  });
}

// Folders, one way. Each folder of src/ is a unit, and so is each file at src/'s root; an edge
// is "some file of A imports some file of B" (type-only imports count). A new edge fails here:
// add it below only if it points down the layering (the last test keeps the list a layering).
// The base files import nothing but each other and packages; every unit may import them.
const BASE = ['errors.ts', 'log.ts', 'envOverrides.ts', 'version.ts', 'endProcess.ts', 'flagValues.ts', 'nodeDefaults.ts'];

const ALLOWED: Record<string, string[]> = {
  // The entry points.
  'main.ts': ['startNode.ts', 'cli', 'inspect', 'machines', 'native'],
  'index.ts': ['nodeOptions.ts', 'nodeStatus.ts', 'startNode.ts', 'inspect', 'machines', 'models'],
  cli: ['nodeOptions.ts', 'nodeStatus.ts', 'checkpoint', 'client', 'control', 'inspect', 'keeper', 'machines', 'models', 'native', 'wire'],
  client: ['checkpoint', 'native', 'wire'],
  // A node: its start, the actors that do its I/O, the machines that decide.
  'startNode.ts': ['createLogger.ts', 'nodeOptions.ts', 'nodeStatus.ts', 'actors', 'control', 'inspect', 'keeper', 'machines', 'models', 'serve', 'wire'],
  actors: ['nodeOptions.ts', 'checkpoint', 'files', 'inspect', 'keeper', 'machines', 'models', 'native', 'rendezvous', 'serve', 'wire'],
  machines: ['nodeOptions.ts', 'nodeStatus.ts', 'inspect', 'models', 'native', 'rendezvous', 'serve', 'wire'],
  'nodeOptions.ts': ['control', 'models', 'native'],
  // The node's logger: pino, which only a node loads.
  'createLogger.ts': [],
  control: ['nodeStatus.ts', 'checkpoint', 'models', 'wire'],
  // A model.
  models: ['nodeStatus.ts', 'checkpoint', 'files', 'keeper', 'native', 'rendezvous', 'serve', 'wire'],
  rendezvous: ['checkpoint', 'inspect', 'machines', 'models', 'wire'],
  serve: ['checkpoint', 'files', 'native', 'wire'],
  // The keeper's socket name is one of the socket directory's names (wire/socketDir.ts).
  keeper: ['nodeStatus.ts', 'checkpoint', 'files', 'inspect', 'native', 'wire'],
  inspect: ['nodeStatus.ts', 'files', 'wire'],
  'nodeStatus.ts': ['files', 'native', 'wire'],
  // The wire: what a client and the daemon share.
  wire: ['files', 'native'],
  native: ['checkpoint'],
  checkpoint: ['files'],
  files: [],
};

// The edges above that still point up, each with why; the layering test ignores them and fails
// when one is no longer needed (then delete it here and from ALLOWED).
const UPWARD: Record<string, string> = {
  'rendezvous -> machines': "node 0's coordinator server runs the coordinator machine, whose rules import rendezvous/'s messages and checks",
  'rendezvous -> models': "node 0's model-group registry runs the model-group machines, which import rendezvous/'s messages and checks",
};

/** The folder under src/ a file is in, or the file's own name at the root. */
const unitOf = (f: string): string => relative(srcDir, f).split('/')[0]!;
const folderEdges = new Map<string, string[]>();
for (const [file, deps] of graph) {
  const from = unitOf(file);
  for (const d of deps) {
    const to = unitOf(d);
    if (to === from || BASE.includes(to)) continue;
    const key = `${from} -> ${to}`;
    folderEdges.set(key, [...(folderEdges.get(key) ?? []), `${name(file)} imports ${name(d)}`]);
  }
}
const allowedEdges = new Set(Object.entries(ALLOWED).flatMap(([from, tos]) => tos.map((to) => `${from} -> ${to}`)));

test('the base files import nothing but each other', () => {
  const outside = [...graph].filter(([f]) => BASE.includes(unitOf(f))).flatMap(([f, deps]) => deps.filter((d) => !BASE.includes(unitOf(d))).map((d) => `${name(f)} imports ${name(d)}`));
  assert.equal(outside, []);
});

test('every folder edge of src/ is one the layering allows', () => {
  const units = new Set([...graph.keys()].map(unitOf).filter((u) => !BASE.includes(u)));
  assert.equal([...units].filter((u) => !(u in ALLOWED)).sort(), [], 'a new folder or root file: give it a place in ALLOWED');
  const unlisted = [...folderEdges].filter(([e]) => !allowedEdges.has(e)).map(([e, why]) => `${e} (${why[0]})`);
  assert.equal(unlisted, []);
});

test('every allowed folder edge is still used', () => {
  assert.equal([...allowedEdges].filter((e) => !folderEdges.has(e)), []);
});

test('the allowed folder edges, less the listed upward ones, form a layering', () => {
  for (const e of Object.keys(UPWARD)) assert.ok(allowedEdges.has(e), `UPWARD names ${e}, which ALLOWED does not list`);
  const down = new Map<string, string[]>();
  for (const e of allowedEdges) if (!(e in UPWARD)) { const [from, to] = e.split(' -> ') as [string, string]; down.set(from, [...(down.get(from) ?? []), to]); }
  const cycles: string[] = [];
  const done = new Set<string>();
  const stack: string[] = [];
  const visit = (u: string) => {
    const at = stack.indexOf(u);
    if (at >= 0) return void cycles.push([...stack.slice(at), u].join(' -> '));
    if (done.has(u)) return;
    stack.push(u);
    for (const v of down.get(u) ?? []) visit(v);
    stack.pop();
    done.add(u);
  };
  for (const u of Object.keys(ALLOWED)) visit(u);
  assert.equal(cycles, []);
  // Each upward edge must still close a cycle; else it is an ordinary downward edge now.
  const reaches = (from: string, to: string, seen = new Set<string>()): boolean => from === to || (!seen.has(from) && (seen.add(from), (down.get(from) ?? []).some((v) => reaches(v, to, seen))));
  for (const e of Object.keys(UPWARD)) { const [from, to] = e.split(' -> ') as [string, string]; assert.ok(reaches(to, from), `${e} no longer points up: move it out of UPWARD`); }
});

test.run();
