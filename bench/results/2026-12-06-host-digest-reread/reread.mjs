// What one rank's host fill reads twice to hash the checkpoint's tensors (issue 33, tp=2 against
// tp=1): every rank's plan asks for the full-content digests of every checkpoint tensor
// (contentTensors, docs/spec/fingerprint.md §8), and the digest pieces its own fill did not read
// whole are read again (ContentDigests::hashRest, the fill's digestRereadBytes). One rank's
// allocate and fill in this process, as bench/results/2026-12-06-host-segments-default/fill-phase.mjs.
// Usage: node reread.mjs TREE MODEL_DIR TP RANK   (prints one JSON line)
import { cpuUsage } from 'node:process';
import { loadavg } from 'node:os';
const [tree, model, tp, rank] = process.argv.slice(2);
const { DeviceHandle } = await import(`${tree}/dist/src/native/deviceHandle.js`);
const { planCheckpoint } = await import(`${tree}/dist/src/checkpoint/planCheckpoint.js`);
const { FILL_SIZING } = await import(`${tree}/dist/src/native/fillPolicy.js`);
const plan = (await planCheckpoint(model, { tpSize: Number(tp), segments: 'host' })).ranks[Number(rank)];
const device = new DeviceHandle('host', 0, { uuid: `reread-${process.pid}` });
await device.allocate(plan.segments);
const c0 = cpuUsage();
const t0 = performance.now();
const r = await device.fill(plan.files, plan.ops, plan.totalBytes, { threads: FILL_SIZING.threads, chunkBytes: FILL_SIZING.chunkBytes, zeroRanges: plan.zeroRanges, tensorRanges: plan.contentTensors.ranges });
const t1 = performance.now();
const c = cpuUsage(c0);
await device.free();
console.log(JSON.stringify({ tp: Number(tp), rank: Number(rank), filledBytes: plan.totalBytes, digestRereadBytes: r.digestRereadBytes, fillMs: Math.round(t1 - t0), cpuMs: Math.round((c.user + c.system) / 1000), loadavg: loadavg() }));
