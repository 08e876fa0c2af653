// One rank's allocate and fill on the host backend, outside the daemon, timed in this process:
// wall clock of each phase and this process's CPU (every thread) across both. The tree given
// supplies the addon and the planner, so main and this branch are timed by the same script.
// Planned with `segments: 'host'`, the cut this branch's daemon gives a host arena; main's
// planner knows no such option and keeps the arena whole, as its daemon does.
// Usage: node fill-phase.mjs TREE MODEL_DIR TP RANK   (prints one JSON line)
// (bench/results/2026-12-05-host-fill-alloc/fill-phase.mjs, with the segments option.)
import { cpuUsage } from 'node:process';
const [tree, model, tp, rank] = process.argv.slice(2);
const { DeviceHandle } = await import(`${tree}/dist/src/native/deviceHandle.js`);
const { planCheckpoint } = await import(`${tree}/dist/src/checkpoint/planCheckpoint.js`);
const { FILL_SIZING } = await import(`${tree}/dist/src/native/fillPolicy.js`);
const plan = (await planCheckpoint(model, { tpSize: Number(tp), segments: 'host' })).ranks[Number(rank)];
const device = new DeviceHandle('host', 0, { uuid: `fill-phase-${process.pid}` });
const c0 = cpuUsage();
const t0 = performance.now();
await device.allocate(plan.segments);
const t1 = performance.now();
await device.fill(plan.files, plan.ops, plan.totalBytes, { threads: FILL_SIZING.threads, chunkBytes: FILL_SIZING.chunkBytes, zeroRanges: plan.zeroRanges, tensorRanges: plan.contentTensors.ranges });
const t2 = performance.now();
const c = cpuUsage(c0);
await device.free();
console.log(JSON.stringify({ tree, bytes: plan.totalBytes, segments: plan.segments.length, allocateMs: t1 - t0, fillMs: t2 - t1, totalMs: t2 - t0, cpuMs: (c.user + c.system) / 1000, loadavg: (await import('node:os')).loadavg() }));
