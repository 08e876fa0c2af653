// A node's host fill at tp=1 or tp=2 in this process, as the daemon's rank workers run it (each
// rank's allocate, then every rank's fill at once, host segments, the fill sizing of
// src/native/fillPolicy.ts), with the tree's own fill options: a tree whose nodeFillOptions gives
// host ranks a group (the digest group, native/host_digest_group.h) fills as one.
// Usage: node fill-ranks.mjs TREE MODEL_DIR TP   (prints one JSON line)
import { cpuUsage } from 'node:process';
import { loadavg } from 'node:os';
const [tree, model, tpArg] = process.argv.slice(2);
const tp = Number(tpArg);
const { DeviceHandle } = await import(`${tree}/dist/src/native/deviceHandle.js`);
const { planCheckpoint } = await import(`${tree}/dist/src/checkpoint/planCheckpoint.js`);
const { FILL_SIZING, nodeFillOptions } = await import(`${tree}/dist/src/native/fillPolicy.js`);
const plan = await planCheckpoint(model, { tpSize: tp, segments: 'host' });
const slots = plan.ranks.map((_, i) => ({ backend: 'host', index: i, uuid: `fill-ranks-${process.pid}-${i}` }));
const fill = await nodeFillOptions({ threads: FILL_SIZING.threads, chunkBytes: FILL_SIZING.chunkBytes }, slots);
const devices = slots.map((s) => new DeviceHandle('host', s.index, { uuid: s.uuid }));
for (const [i, d] of devices.entries()) await d.allocate(plan.ranks[i].segments);
const c0 = cpuUsage();
const t0 = performance.now();
const filled = await Promise.all(
  devices.map((d, i) => {
    const r = plan.ranks[i];
    return d.fill(r.files, r.ops, r.totalBytes, { ...fill, zeroRanges: r.zeroRanges, tensorRanges: r.contentTensors.ranges });
  }),
);
const t1 = performance.now();
const c = cpuUsage(c0);
for (const d of devices) await d.free();
const same = filled.every((f) => JSON.stringify(f.digests) === JSON.stringify(filled[0].digests));
console.log(JSON.stringify({ tree, tp, group: fill.group !== undefined, filledBytes: plan.ranks.reduce((n, r) => n + r.totalBytes, 0), digestRereadBytes: filled.map((f) => f.digestRereadBytes), sameDigests: same, fillMs: Math.round(t1 - t0), cpuMs: Math.round((c.user + c.system) / 1000), loadavg: loadavg() }));
