// Start-up overhead of two or more builds of weightd, paired in one run: for each repetition every
// build runs back to back, the order reversed every other repetition, so that the machine's load
// drifts over all alike.
//   node:    wall clock of `node <flags> -e 0`, Node's own start: the floor under every figure;
//   version: wall clock from spawning `weightd --version` to its exit (Node's start and the
//            command line's module loading, nothing else);
//   ready:   wall clock from spawning a daemon on --model (host backend unless --device says
//            otherwise) to its READY line, each phase's line on the daemon's own clock
//            (sinceStartMs), and the daemon's own memory from its /proc: RssAnon at READY and
//            its sampled peak, VmHWM;
//   ctl:     wall clock of `weightd ctl list` against that daemon, spawn to exit.
// Each also with its CPU time (user + system, every thread; the daemon's at READY), which a
// loaded machine moves less than the wall clock.
// Every process gets Node's flags from scripts/node-flags, as the launchers give them. Once per
// build, unrecorded in the timings, modules.json counts the modules each command loads (every
// thread; test/cli/fixtures/recordModules.ts).
// Usage: node dist/bench/startup.js --before OLD/dist/main.js [--after dist/main.js] --out DIR
//          [--build NAME=MAIN ...] [--model DIR] [--device host] [--runs 10]
// --build adds builds after before and after (each NAME once). Writes raw.jsonl (one line per
// process), modules.json and summary.json (medians, and for each build the median of its paired
// differences from the first) into --out, which must not exist yet.
import { spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { exampleModel, mainJs, repoRoot } from '../test/helpers/paths.js';
import { median, processCpuMs, spawnUntilReady } from './measure.js';

const { values } = parseArgs({
  options: {
    before: { type: 'string' }, after: { type: 'string', default: mainJs }, build: { type: 'string', multiple: true, default: [] }, out: { type: 'string' },
    model: { type: 'string', default: exampleModel }, device: { type: 'string', default: 'host' }, runs: { type: 'string', default: '10' },
  },
});
if (!values.before || !values.out) throw new Error('--before OLD/dist/main.js and --out DIR (a new folder) are required');
const builds = new Map<string, string>([['before', resolve(values.before)], ['after', resolve(values.after!)]]);
for (const b of values.build!) {
  const [name, main] = [b.slice(0, b.indexOf('=')), b.slice(b.indexOf('=') + 1)];
  if (!name || !main || builds.has(name)) throw new Error(`--build ${b}: pass NAME=PATH/TO/main, each NAME once (before and after are taken)`);
  builds.set(name, resolve(main));
}
const out = resolve(values.out);
if (existsSync(out)) throw new Error(`${out} exists: every run gets a new folder, never an old one`);
mkdirSync(out, { recursive: true });
const model = resolve(values.model!);
const device = values.device!;
const runs = Number(values.runs);
const names = [...builds.keys()];
const nodeFlags = readFileSync(join(repoRoot, 'scripts/node-flags'), 'utf8').split('\n').filter((l) => l.trim() !== '' && !l.startsWith('#'));
const recorder = join(repoRoot, 'dist/test/cli/fixtures/recordModules.js');

/**
 * Spawn to exit of `node <flags> ...args`, and the CPU time it used (user + system, all its
 * threads): on a loaded machine the steadier of the two. bash's `times` reports its children's.
 */
function timed(what: string, args: string[], env: NodeJS.ProcessEnv = process.env): { wallMs: number; cpuMs: number } {
  const t0 = performance.now();
  const r = spawnSync('bash', ['-c', '"$@" >/dev/null || exit; times', 'timed', process.execPath, ...nodeFlags, ...args], { encoding: 'utf8', env });
  const wallMs = performance.now() - t0;
  if (r.status !== 0) throw new Error(`${what} failed: ${r.stderr}`);
  const [user, sys] = [...r.stdout.trim().split('\n').at(-1)!.matchAll(/(\d+)m([\d.]+)s/g)].map((m) => (Number(m[1]) * 60 + Number(m[2])) * 1000);
  return { wallMs, cpuMs: user! + sys! };
}

interface Ready {
  wallMs: number;
  phases: Record<string, number>;
  rssAnonAtReadyBytes: number;
  peakRssAnonBytes: number;
  vmHwmBytes: number;
  /** The daemon's CPU time at READY. */
  cpuAtReadyMs: number;
  ctlListMs: number;
  ctlListCpuMs: number;
}

/** A daemon of `build` to READY, `ctl list` against it, and its stop; `env` adds to each one's environment. */
async function ready(build: string, run: number, env: { daemon?: NodeJS.ProcessEnv; ctl?: NodeJS.ProcessEnv } = {}, log = join(out, 'daemon.jsonl')): Promise<Ready> {
  const main = builds.get(build)!;
  const socketDir = mkdtempSync(join(tmpdir(), 'wd-bench-'));
  try {
    const daemonEnv = { ...process.env, WEIGHTD_HOST_DEVICES: `bench-${process.pid}-${build}-${run}`, ...env.daemon };
    const d = await spawnUntilReady([process.execPath, ...nodeFlags, main, '--model', model, '--device', device, '--weight-cache-socket-dir', socketDir], daemonEnv);
    const cpuAtReadyMs = processCpuMs(d.pid);
    const memory = d.memory();
    const phases: Record<string, number> = {};
    for (const l of d.lines()) {
      const phase = /^(control socket|checkpoint planned|single node: rank table|all \d+ local ranks loaded|READY)/.exec(l.msg)?.[1];
      if (phase) phases[phase.replace(/\d+ /, '')] = l.sinceStartMs;
    }
    const ctl = timed(`${build} ctl list`, [main, 'ctl', 'list', '--weight-cache-socket-dir', socketDir], { ...process.env, ...env.ctl });
    await d.stop(log, { build, run });
    return { wallMs: d.wallMs, phases, rssAnonAtReadyBytes: memory.rssAnon, peakRssAnonBytes: memory.peakRssAnon, vmHwmBytes: memory.vmHwm, cpuAtReadyMs, ctlListMs: ctl.wallMs, ctlListCpuMs: ctl.cpuMs };
  } finally {
    rmSync(socketDir, { recursive: true, force: true });
  }
}

/** What a recorded run loaded (node: built-ins left out): ES modules, CommonJS ones, and files per package. */
function countOf(record: string) {
  const files = readFileSync(record, 'utf8').trim().split('\n').filter((l) => !/ node:/.test(l));
  const packages: Record<string, number> = {};
  for (const l of files) {
    const pkg = /\/node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(l)?.[1];
    if (pkg) packages[pkg] = (packages[pkg] ?? 0) + 1;
  }
  return { esm: files.filter((l) => l.startsWith('esm ')).length, cjs: files.filter((l) => l.startsWith('cjs ')).length, packages };
}

/** How many files each command of `build` loads, every thread, with the recorder preloaded; the records stay in --out. */
async function census(build: string) {
  const recorded = (command: string) => {
    const record = join(out, `modules-${build}-${command}.txt`);
    return { record, env: { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${recorder}`, WEIGHTD_TEST_MODULES: record } };
  };
  const [version, daemon, ctl] = [recorded('version'), recorded('daemon'), recorded('ctl-list')];
  timed(`${build} --version`, [builds.get(build)!, '--version'], { ...process.env, ...version.env });
  await ready(build, 0, { daemon: daemon.env, ctl: ctl.env }, join(out, 'census-daemon.jsonl'));
  return { '--version': countOf(version.record), 'daemon to READY and its stop': countOf(daemon.record), 'ctl list': countOf(ctl.record) };
}

const files = readdirSync(model).filter((f) => f.endsWith('.safetensors')).map((f) => join(model, f));
spawnSync('cat', files, { stdio: ['ignore', 'ignore', 'inherit'] }); // hot page cache for every build
// One of each first, unrecorded: the builds' files and Node itself come into the page cache.
for (const build of names) timed(`${build} --version`, [builds.get(build)!, '--version']), await ready(build, 0);

type Row = { build: string; run: number; nodeMs: number; nodeCpuMs: number; versionMs: number; versionCpuMs: number; loadavg1: number } & Ready;
const rows: Row[] = [];
for (let run = 1; run <= runs; run++) {
  const order = run % 2 === 1 ? names : [...names].reverse();
  for (const build of order) {
    const node = timed('node -e 0', ['-e', '0']);
    const version = timed(`${build} --version`, [builds.get(build)!, '--version']);
    const row = { build, run, nodeMs: node.wallMs, nodeCpuMs: node.cpuMs, versionMs: version.wallMs, versionCpuMs: version.cpuMs, ...(await ready(build, run)), loadavg1: loadavg()[0]! };
    appendFileSync(join(out, 'raw.jsonl'), `${JSON.stringify(row)}\n`);
    rows.push(row);
  }
}

const modules: Record<string, unknown> = {};
for (const build of names) modules[build] = await census(build);
writeFileSync(join(out, 'modules.json'), `${JSON.stringify(modules, null, 1)}\n`);

const of = (build: string) => rows.filter((r) => r.build === build);
const paired = (build: string, value: (r: Row) => number) => {
  const diffs = Array.from({ length: runs }, (_, i) => value(of(build)[i]!) - value(of(names[0]!)[i]!));
  return { median: median(diffs), min: Math.min(...diffs), max: Math.max(...diffs) };
};
const side = (build: string) => ({
  main: builds.get(build),
  nodeMsMedian: median(of(build).map((r) => r.nodeMs)),
  nodeCpuMsMedian: median(of(build).map((r) => r.nodeCpuMs)),
  versionMsMedian: median(of(build).map((r) => r.versionMs)),
  versionMsBest: Math.min(...of(build).map((r) => r.versionMs)),
  versionCpuMsMedian: median(of(build).map((r) => r.versionCpuMs)),
  ctlListMsMedian: median(of(build).map((r) => r.ctlListMs)),
  ctlListMsBest: Math.min(...of(build).map((r) => r.ctlListMs)),
  ctlListCpuMsMedian: median(of(build).map((r) => r.ctlListCpuMs)),
  cpuAtReadyMsMedian: median(of(build).map((r) => r.cpuAtReadyMs)),
  readyWallMsMedian: median(of(build).map((r) => r.wallMs)),
  readyWallMsBest: Math.min(...of(build).map((r) => r.wallMs)),
  phasesMedian: Object.fromEntries(Object.keys(of(build)[0]!.phases).map((k) => [k, median(of(build).map((r) => r.phases[k] ?? NaN))])),
  rssAnonAtReadyBytesMedian: median(of(build).map((r) => r.rssAnonAtReadyBytes)),
  peakRssAnonBytesMax: Math.max(...of(build).map((r) => r.peakRssAnonBytes)),
  vmHwmBytesMedian: median(of(build).map((r) => r.vmHwmBytes)),
});
const summary = {
  date: new Date().toISOString(),
  device,
  model,
  runs,
  nodeFlags,
  /** The 1-minute load average after each process: other work on the machine shares its cores. */
  loadavg1: { min: Math.min(...rows.map((r) => r.loadavg1)), max: Math.max(...rows.map((r) => r.loadavg1)) },
  builds: Object.fromEntries(names.map((b) => [b, side(b)])),
  /** Each build against the first, repetition by repetition: median, min and max of the differences. */
  pairedAgainstFirst: Object.fromEntries(
    names.slice(1).map((b) => [
      b,
      {
        versionMs: paired(b, (r) => r.versionMs),
        versionCpuMs: paired(b, (r) => r.versionCpuMs),
        ctlListMs: paired(b, (r) => r.ctlListMs),
        ctlListCpuMs: paired(b, (r) => r.ctlListCpuMs),
        cpuAtReadyMs: paired(b, (r) => r.cpuAtReadyMs),
        readyWallMs: paired(b, (r) => r.wallMs),
        firstLogLineMs: paired(b, (r) => r.phases['control socket'] ?? NaN),
        rssAnonAtReadyBytes: paired(b, (r) => r.rssAnonAtReadyBytes),
      },
    ]),
  ),
};
writeFileSync(join(out, 'summary.json'), `${JSON.stringify(summary, null, 1)}\n`);
console.log(JSON.stringify(summary));
