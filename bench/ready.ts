// What an operator and a restarting engine wait for, timed as they see it, with the baseline
// timed the same way in the same run:
//   ready:    wall clock from spawning the daemon to its READY line, and each phase's line on the
//             daemon's own clock since its start (sinceStartMs); the daemon's peak RSS from its
//             own /proc/<pid>/status (VmHWM, which on the host backend counts the arena it maps)
//             and the peak of its own heap (RssAnon, sampled), not this process's;
//   attach:   a fresh Python process attaching to the ready daemon: the first attach (the one a
//             restarting engine pays) and a second one, timed inside that process;
//   baseline: a fresh process loading the same files without weightd, wall clock from spawn to
//             done: safetensors' load_file onto the GPU (cuda), or `cp` into /dev/shm (host).
// Usage: node dist/bench/ready.js --model DIR --out DIR [--device host|cuda] [--runs 3] [--tp 1,2] [--plan-file FILE]
//   --tp: the tensor-parallel sizes to start, each once per run (one node holding every rank).
//   --plan-file: given to each daemon (its segmentBytes cuts each rank's arena into segments).
// Writes raw.jsonl (one line per measurement), daemon.jsonl (each daemon's log, by run) and
// summary.json (medians) into --out, which must not exist yet: every run keeps its own folder.
import { spawnSync } from 'node:child_process';
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { exampleModel } from '../test/helpers/paths.js';
import { attachInFreshProcess, benchRun, median, processCpuMs, spawnUntilReady } from './measure.js';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: exampleModel }, out: { type: 'string' }, device: { type: 'string', default: 'host' }, runs: { type: 'string', default: '3' },
    tp: { type: 'string', default: '1' }, 'plan-file': { type: 'string' },
  },
});
const { out, model, device, runs, files, bytes, daemon, python } = benchRun(values, 'ready');
const tps = values.tp!.split(',').map(Number);

function record(row: Record<string, unknown>): void {
  appendFileSync(join(out, 'raw.jsonl'), `${JSON.stringify(row)}\n`);
}

interface Ready {
  wallMs: number;
  /** The daemon's CPU time (every thread, user and system) from its start to READY, in 10 ms ticks. */
  cpuMs: number;
  phases: Record<string, number>;
  peakRssBytes: number;
  /** The daemon's own heap at its peak (RssAnon, sampled): on the host backend VmHWM counts the arena. */
  peakRssAnonBytes: number;
  socketDir: string;
  stop: () => Promise<void>;
}

/** Spawns the daemon and resolves at its READY line, with the run's figures; stop() ends it. */
async function startDaemon(run: number, tp: number): Promise<Ready> {
  const socketDir = mkdtempSync(join(tmpdir(), 'wd-bench-'));
  const hostDevices = Array.from({ length: tp }, (_, i) => `bench-${process.pid}-${run}-${i}`).join(',');
  const d = await spawnUntilReady([...daemon, '--model', model, '--device', device, '--tensor-parallel-size', String(tp), '--weight-cache-socket-dir', socketDir, ...(values['plan-file'] ? ['--plan-file', values['plan-file']] : [])], { ...process.env, WEIGHTD_HOST_DEVICES: hostDevices });
  const cpuMs = processCpuMs(d.pid);
  const phases: Record<string, number> = {};
  for (const l of d.lines()) {
    const phase = /^(CUDA devices|no CUDA device|checkpoint planned|single node: rank table|all \d+ local ranks loaded|READY)/.exec(l.msg)?.[1];
    if (phase) phases[phase.replace(/\d+ /, '')] = l.sinceStartMs;
  }
  return {
    wallMs: d.wallMs,
    cpuMs,
    phases,
    peakRssBytes: d.memory().vmHwm,
    peakRssAnonBytes: d.memory().peakRssAnon,
    socketDir,
    stop: async () => {
      await d.stop(join(out, 'daemon.jsonl'), { run, tp });
      rmSync(socketDir, { recursive: true, force: true });
    },
  };
}

/** The same files loaded without weightd by a fresh process: wall clock from spawn to done. */
function baselineMs(): number {
  if (device === 'cuda') {
    const script = `
import sys, torch
from safetensors.torch import load_file
for f in sys.argv[1:]: load_file(f, device="cuda:0")
torch.cuda.synchronize()
`;
    const t0 = performance.now();
    const r = spawnSync(python, ['-c', script, ...files], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`baseline failed: ${r.stderr}`);
    return performance.now() - t0;
  }
  const dest = mkdtempSync('/dev/shm/wd-bench-cp-');
  try {
    const t0 = performance.now();
    const r = spawnSync('cp', [...files, dest]);
    if (r.status !== 0) throw new Error(`cp failed: ${r.stderr}`);
    return performance.now() - t0;
  } finally {
    rmSync(dest, { recursive: true, force: true });
  }
}

spawnSync('cat', files, { stdio: ['ignore', 'ignore', 'inherit'] }); // hot page cache for both sides
const ready: Array<Ready & { tp: number }> = [];
const attaches: Array<ReturnType<typeof attachInFreshProcess>> = [];
const baselines: number[] = [];
for (let run = 1; run <= runs; run++) {
  for (const tp of tps) {
    const r = await startDaemon(run, tp);
    let attach: ReturnType<typeof attachInFreshProcess>;
    try {
      attach = attachInFreshProcess(r.socketDir, device);
    } finally {
      // A failed attach must not leave the daemon (and its arena) running after the benchmark.
      await r.stop();
    }
    record({ run, device, model, bytes, tp, readyWallMs: r.wallMs, cpuAtReadyMs: r.cpuMs, phases: r.phases, peakRssBytes: r.peakRssBytes, peakRssAnonBytes: r.peakRssAnonBytes, attach });
    ready.push({ ...r, tp });
    attaches.push(attach);
  }
  const base = baselineMs();
  record({ run, device, model, bytes, baselineWallMs: base });
  baselines.push(base);
}
const byTp = (tp: number) => ready.filter((r) => r.tp === tp);
const summary = {
  date: new Date().toISOString(),
  device,
  model,
  bytes,
  runs,
  readyWallMsMedian: median(byTp(tps[0]!).map((r) => r.wallMs)),
  readyWallMsBest: Math.min(...byTp(tps[0]!).map((r) => r.wallMs)),
  byTp: Object.fromEntries(tps.map((tp) => [tp, {
    readyWallMsMedian: median(byTp(tp).map((r) => r.wallMs)),
    readyWallMsBest: Math.min(...byTp(tp).map((r) => r.wallMs)),
    cpuAtReadyMsMedian: median(byTp(tp).map((r) => r.cpuMs)),
    peakRssAnonBytesMax: Math.max(...byTp(tp).map((r) => r.peakRssAnonBytes)),
    phasesMedian: Object.fromEntries(Object.keys(byTp(tp)[0]!.phases).map((k) => [k, median(byTp(tp).map((r) => r.phases[k] ?? NaN))])),
  }])),
  baselineWallMsMedian: median(baselines),
  baselineWallMsBest: Math.min(...baselines),
  baseline: device === 'cuda' ? 'safetensors load_file(cuda:0) in a fresh python3, spawn to done' : 'cp to /dev/shm, spawn to done',
  firstAttachMsMedian: median(attaches.map((a) => a.firstMs)),
  secondAttachMsMedian: median(attaches.map((a) => a.secondMs)),
  tensors: attaches[0]?.tensors,
  peakRssBytesMax: Math.max(...ready.map((r) => r.peakRssBytes)),
  peakRssAnonBytesMax: Math.max(...ready.map((r) => r.peakRssAnonBytes)),
  phasesMedian: Object.fromEntries(Object.keys(ready[0]!.phases).map((k) => [k, median(byTp(tps[0]!).map((r) => r.phases[k] ?? NaN))])),
};
writeFileSync(join(out, 'summary.json'), `${JSON.stringify(summary, null, 1)}\n`);
console.log(JSON.stringify(summary));
