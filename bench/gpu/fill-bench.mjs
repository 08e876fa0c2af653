#!/usr/bin/env node
// Times the cuda copy engine filling GPUs from a safetensors checkpoint.
//   node bench/gpu/fill-bench.mjs --ckpt DIR [--devices 0,1] [--tp 1] [--reps 3] [--cold]
//        [--configs '[{"mode":"pread"},{"mode":"register","chunkBytes":67108864}]'] [--out FILE]
//        [--disjoint]
// Every device fills its rank's arena at once (one worker thread each, as in the daemon); with
// tp=1 every device loads the whole checkpoint, or with --disjoint its share of the files (so
// no two GPUs read the same bytes). --cold drops the page cache before each rep
// (root only). Prints (and with --out appends) one JSON line per config as it finishes: per rep
// each device's fill seconds by the native clock (start to last copy landed) and the wall time
// seen from JS (which adds the status poll's lag: up to 20 ms before 2026-12-07, ~1 ms since), the bytes its digests read again at
// the end (digestRereadBytes: 0 when every tensor passed whole through a window), the bytes its
// digests hashed on the GPU (digestGpuBytes) and why not more (digestGpuUnavailable), the GPU
// digests' setup and the wait for their kernels after the last copy (digestGpuSetupSeconds,
// digestGpuTailSeconds), GB/s (1e9 bytes) of payload over all
// devices from the slowest device's native seconds, and the process's peak RSS so far.
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { GpuFleet, dropCaches, fillSeconds, peakRssMiB } from './gpuFleet.mjs';
import { rankPlans } from './rankPlans.mjs';

const { values: args } = parseArgs({
  options: {
    ckpt: { type: 'string' },
    devices: { type: 'string', default: '0' },
    tp: { type: 'string', default: '1' },
    reps: { type: 'string', default: '3' },
    cold: { type: 'boolean', default: false },
    disjoint: { type: 'boolean', default: false },
    configs: { type: 'string', default: '[{}]' },
    label: { type: 'string', default: '' },
    out: { type: 'string' },
  },
});
if (!args.ckpt) {
  console.error('usage: fill-bench.mjs --ckpt DIR [--devices 0,1] [--tp N] [--reps N] [--cold] [--configs JSON] [--out FILE]');
  process.exit(2);
}

const devices = args.devices.split(',').map(Number);
const tp = Number(args.tp);
const reps = Number(args.reps);
const configs = JSON.parse(args.configs);
// The daemon's plans. With tp > 1 device k holds rank k; with tp = 1 each device holds
// everything (or, disjoint, the ops of every devices.length-th file from the k-th, in an arena
// sized for the whole checkpoint).
const plans = await rankPlans(args.ckpt, tp);
const members = devices.map((index, k) => {
  const plan = plans[tp > 1 ? k : 0];
  if (!args.disjoint) return { index, plan };
  const ops = plan.ops.filter((op) => op.file % devices.length === k);
  const tensors = plan.tensors.filter((t) => plan.files.indexOf(t.path) % devices.length === k);
  return { index, plan: { ...plan, ops, tensors, payloadBytes: ops.reduce((n, op) => n + op.rows * op.rowBytes, 0) } };
});
const payloadBytes = members.reduce((n, m) => n + m.plan.payloadBytes, 0);

const fleet = await GpuFleet.open(members);
const info = await fleet.all('info');
for (const options of configs) {
  const runs = [];
  for (let r = 0; r < reps; r++) {
    if (args.cold) dropCaches();
    const run = await fleet.fill(options);
    runs.push({
      wall: run.wall, deviceSeconds: run.devices.map((d) => d.seconds), digestRereadBytes: run.devices.map((d) => d.digestRereadBytes),
      digestGpuBytes: run.devices.map((d) => d.digestGpuBytes), digestGpuUnavailable: run.devices.map((d) => d.digestGpuUnavailable ?? null),
      digestGpuSetupSeconds: run.devices.map((d) => d.digestGpuSetupSeconds ?? null),
      digestGpuTailSeconds: run.devices.map((d) => d.digestGpuTailSeconds ?? null),
    });
  }
  const { best, median } = fillSeconds(runs);
  const entry = {
    options,
    runs,
    bestSeconds: best,
    medianSeconds: median,
    bestGBps: payloadBytes / best / 1e9,
    medianGBps: payloadBytes / median / 1e9,
  };
  console.error(`${args.label} ${JSON.stringify(options)}: best ${entry.bestGBps.toFixed(2)} GB/s, median ${entry.medianGBps.toFixed(2)} GB/s over ${devices.length} GPU(s)`);
  // A line per config, written at once: a run cut short by a time limit keeps what it measured.
  const line = JSON.stringify({
    label: args.label,
    devices: info.map((d) => ({ index: d.index, uuid: d.uuid, name: d.name, openSeconds: d.openSeconds })),
    tp,
    cold: args.cold,
    disjoint: args.disjoint,
    files: plans[0].files.length,
    tensors: plans[0].tensors.length,
    payloadBytes,
    results: [entry],
    peakRssMiB: peakRssMiB(),
  });
  if (args.out) writeFileSync(args.out, line + '\n', { flag: 'a' });
  console.log(line);
}
await fleet.close();
