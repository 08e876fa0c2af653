// Start-up overhead of two builds of weightd, paired in one run: for each repetition both builds
// run back to back, in alternating order, so that the machine's load drifts over both alike.
//   version: wall clock from spawning `weightd --version` to its exit (Node's start and the
//            command line's module loading, nothing else);
//   ready:   wall clock from spawning a daemon on --model (host backend unless --device says
//            otherwise) to its READY line, each phase's line on the daemon's own clock
//            (sinceStartMs), and the daemon's own memory from its /proc: RssAnon at READY and
//            its sampled peak, VmHWM.
// Usage: node dist/bench/startup.js --before OLD/dist/main.js [--after dist/main.js] --out DIR
//          [--model DIR] [--device host] [--runs 10]
// Writes raw.jsonl (one line per process) and summary.json (medians, and the median of the
// paired differences after - before) into --out, which must not exist yet.
import { spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { exampleModel, mainJs } from '../test/helpers/paths.js';
import { median, spawnUntilReady } from './measure.js';

const { values } = parseArgs({
  options: {
    before: { type: 'string' }, after: { type: 'string', default: mainJs }, out: { type: 'string' }, model: { type: 'string', default: exampleModel },
    device: { type: 'string', default: 'host' }, runs: { type: 'string', default: '10' },
  },
});
if (!values.before || !values.out) throw new Error('--before OLD/dist/main.js and --out DIR (a new folder) are required');
const out = resolve(values.out);
if (existsSync(out)) throw new Error(`${out} exists: every run gets a new folder, never an old one`);
mkdirSync(out, { recursive: true });
const builds = { before: resolve(values.before), after: resolve(values.after!) };
const model = resolve(values.model!);
const device = values.device!;
const runs = Number(values.runs);
type Build = keyof typeof builds;


function versionMs(build: Build): number {
  const t0 = performance.now();
  const r = spawnSync(process.execPath, [builds[build], '--version'], { encoding: 'utf8' });
  const ms = performance.now() - t0;
  if (r.status !== 0) throw new Error(`${build} --version failed: ${r.stderr}`);
  return ms;
}

interface Ready {
  wallMs: number;
  phases: Record<string, number>;
  rssAnonAtReadyBytes: number;
  peakRssAnonBytes: number;
  vmHwmBytes: number;
}

async function ready(build: Build, run: number): Promise<Ready> {
  const socketDir = mkdtempSync(join(tmpdir(), 'wd-bench-'));
  try {
    const env = { ...process.env, WEIGHTD_HOST_DEVICES: `bench-${process.pid}-${build}-${run}` };
    const d = await spawnUntilReady([process.execPath, builds[build], '--model', model, '--device', device, '--weight-cache-socket-dir', socketDir], env);
    const memory = d.memory();
    const phases: Record<string, number> = {};
    for (const l of d.lines()) {
      const phase = /^(control socket|checkpoint planned|single node: rank table|all \d+ local ranks loaded|READY)/.exec(l.msg)?.[1];
      if (phase) phases[phase.replace(/\d+ /, '')] = l.sinceStartMs;
    }
    await d.stop(join(out, 'daemon.jsonl'), { build, run });
    return { wallMs: d.wallMs, phases, rssAnonAtReadyBytes: memory.rssAnon, peakRssAnonBytes: memory.peakRssAnon, vmHwmBytes: memory.vmHwm };
  } finally {
    rmSync(socketDir, { recursive: true, force: true });
  }
}

const files = readdirSync(model).filter((f) => f.endsWith('.safetensors')).map((f) => join(model, f));
spawnSync('cat', files, { stdio: ['ignore', 'ignore', 'inherit'] }); // hot page cache for both builds
// One of each first, unrecorded: the builds' files and Node itself come into the page cache.
for (const build of ['before', 'after'] as const) versionMs(build), await ready(build, 0);

const rows: Array<{ build: Build; run: number; versionMs: number; loadavg1: number } & Ready> = [];
for (let run = 1; run <= runs; run++) {
  const order: Build[] = run % 2 === 1 ? ['before', 'after'] : ['after', 'before'];
  for (const build of order) {
    const row = { build, run, versionMs: versionMs(build), ...(await ready(build, run)), loadavg1: loadavg()[0]! };
    appendFileSync(join(out, 'raw.jsonl'), `${JSON.stringify(row)}\n`);
    rows.push(row);
  }
}

const of = (build: Build) => rows.filter((r) => r.build === build);
const paired = (value: (r: Ready & { versionMs: number }) => number) =>
  median(Array.from({ length: runs }, (_, i) => value(of('after')[i]!) - value(of('before')[i]!)));
const side = (build: Build) => ({
  versionMsMedian: median(of(build).map((r) => r.versionMs)),
  versionMsBest: Math.min(...of(build).map((r) => r.versionMs)),
  readyWallMsMedian: median(of(build).map((r) => r.wallMs)),
  readyWallMsBest: Math.min(...of(build).map((r) => r.wallMs)),
  phasesMedian: Object.fromEntries(Object.keys(of(build)[0]!.phases).map((k) => [k, median(of(build).map((r) => r.phases[k] ?? NaN))])),
  rssAnonAtReadyBytesMedian: median(of(build).map((r) => r.rssAnonAtReadyBytes)),
  peakRssAnonBytesMax: Math.max(...of(build).map((r) => r.peakRssAnonBytes)),
  vmHwmBytesMedian: median(of(build).map((r) => r.vmHwmBytes)),
});
const summary = {
  date: new Date().toISOString(),
  builds,
  device,
  model,
  runs,
  /** The 1-minute load average after each process: other work on the machine shares its cores. */
  loadavg1: { min: Math.min(...rows.map((r) => r.loadavg1)), max: Math.max(...rows.map((r) => r.loadavg1)) },
  before: side('before'),
  after: side('after'),
  pairedMedianAfterMinusBefore: {
    versionMs: paired((r) => r.versionMs),
    readyWallMs: paired((r) => r.wallMs),
    rssAnonAtReadyBytes: paired((r) => r.rssAnonAtReadyBytes),
  },
};
writeFileSync(join(out, 'summary.json'), `${JSON.stringify(summary, null, 1)}\n`);
console.log(JSON.stringify(summary));
