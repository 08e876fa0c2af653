// One rank's allocate and fill on the host backend, outside the daemon, timed in this process:
// wall clock of each phase and this process's CPU (every thread) across both. The tree given
// supplies the addon and the planner, so main and a branch are timed by the same script.
// Usage: node fill-phase.mjs TREE MODEL_DIR TP RANK   (prints one JSON line)
// HFILL_CHUNK_KIB: the fill's chunk size (default the daemon's, FILL_SIZING); HFILL_PLAN_FILE: a plan
// file (its segmentBytes cuts the arena into several memfds); every HFILL_ variable is
// printed with the result.
import { cpuUsage } from 'node:process';
const [tree, model, tp, rank] = process.argv.slice(2);
const { DeviceHandle } = await import(`${tree}/dist/src/native/deviceHandle.js`);
const { planCheckpoint } = await import(`${tree}/dist/src/checkpoint/planCheckpoint.js`);
const { FILL_SIZING } = await import(`${tree}/dist/src/native/fillPolicy.js`);
const plan = (await planCheckpoint(model, { tpSize: Number(tp), ...(process.env.HFILL_PLAN_FILE ? { planFile: process.env.HFILL_PLAN_FILE } : {}) })).ranks[Number(rank)];
const device = new DeviceHandle('host', 0, { uuid: `fill-phase-${process.pid}` });
const c0 = cpuUsage();
const t0 = performance.now();
await device.allocate(plan.segments);
const t1 = performance.now();
await device.fill(plan.files, plan.ops, plan.totalBytes, { threads: FILL_SIZING.threads, chunkBytes: process.env.HFILL_CHUNK_KIB ? Number(process.env.HFILL_CHUNK_KIB) * 1024 : FILL_SIZING.chunkBytes, zeroRanges: plan.zeroRanges, tensorRanges: plan.contentTensors.ranges });
const t2 = performance.now();
const c = cpuUsage(c0);
await device.free();
console.log(JSON.stringify({ tree, env: Object.fromEntries(Object.entries(process.env).filter(([k]) => k.startsWith('HFILL_'))), bytes: plan.totalBytes, segments: plan.segments.length, allocateMs: t1 - t0, fillMs: t2 - t1, totalMs: t2 - t0, cpuMs: (c.user + c.system) / 1000 }));
