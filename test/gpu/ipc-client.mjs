#!/usr/bin/env node
// The TypeScript client's side of CUDA IPC: opens an exported segment through
// dist/src/native/cuda.js (CudaIpcSegment), reads sampled tensors back and compares them with
// the checkpoint files. Must run in another process than the exporter (the driver refuses a
// process's own handles). With --fd, the segment is a "cuda-fd" descriptor this process
// inherited (CudaIpcSegment.openFd); with --adopt, a DeviceHandle adopts it instead (the next
// daemon's way), reads through the device, and must refuse a fill.
//   node test/gpu/ipc-client.mjs (--handle BASE64 | --fd N --bytes B | --adopt N --bytes B) --plan plan.json [--device 0] [--samples 24]
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { CudaIpcSegment } from '../../dist/src/native/cuda.js';
import { DeviceHandle } from '../../dist/src/native/deviceHandle.js';

const { values: a } = parseArgs({
  options: {
    handle: { type: 'string' }, fd: { type: 'string' }, adopt: { type: 'string' }, bytes: { type: 'string' },
    plan: { type: 'string' }, device: { type: 'string', default: '0' }, samples: { type: 'string', default: '24' },
  },
});
const plan = JSON.parse(readFileSync(a.plan, 'utf8'));
const n = Number(a.samples);
const step = Math.max(1, Math.floor(plan.tensors.length / n));
const picked = plan.tensors.filter((_, i) => i % step === 0).slice(0, n - 1).concat(plan.tensors.at(-1));

const t0 = performance.now();
let seg;
let fillRefused;
if (a.adopt !== undefined) {
  const device = new DeviceHandle('cuda', Number(a.device), { cudaHandles: 'fd' });
  await device.adopt([Number(a.adopt)], [Number(a.bytes)]);
  fillRefused = await device.fill([], [], 0, {}).then(() => 'filled', (err) => err.code);
  seg = { bytes: Number(a.bytes), read: (offset, length) => device.read(0, offset, length), close: () => device.free() };
} else {
  seg = a.fd !== undefined ? CudaIpcSegment.openFd(Number(a.device), Number(a.fd), Number(a.bytes)) : CudaIpcSegment.open(Number(a.device), a.handle);
}
const openMs = performance.now() - t0;
const bad = [];
let checkedBytes = 0;
for (const t of picked) {
  const want = Buffer.allocUnsafe(t.bytes);
  const fd = openSync(t.path, 'r');
  readSync(fd, want, 0, t.bytes, t.begin);
  closeSync(fd);
  if (!Buffer.from(await seg.read(t.offset, t.bytes)).equals(want)) bad.push(t.name);
  checkedBytes += t.bytes;
}
await seg.close();
console.log(JSON.stringify({ ok: bad.length === 0, openMs, segmentBytes: seg.bytes, tensors: picked.length, checkedBytes, mismatched: bad.slice(0, 5), ...(fillRefused ? { fillRefused } : {}) }));
