#!/usr/bin/env node
// Correctness of the cuda backend on real GPUs, against a safetensors checkpoint:
//   1. tensor-parallel fills (tp=2: column slices contiguous, row-parallel slices strided) in
//      pread, register and O_DIRECT modes are byte-identical to numpy's slices of the files;
//      with two GPUs both ranks fill at once, each alone and as one group (one pass over the
//      files, as the daemon fills a node's GPUs);
//   2. an exported arena opened from Python (ctypes, cuIpcOpenMemHandle) and from the
//      TypeScript client (CudaIpcSegment) in other processes holds the checkpoint's bytes;
//   3. --cuda-handles fd: the same arena as VMM memory (cuMemCreate), exported as a descriptor
//      that other processes inherit: mapped from Python (ctypes, cuMemImportFromShareableHandle)
//      and from the TypeScript client (CudaIpcSegment.openFd), and adopted by a second device
//      (DeviceHandle.adopt), each reading the checkpoint's bytes; fill, export, open and adopt
//      times next to legacy IPC's, to decide whether fd can become the default;
//   4. the fill's digests hashed on the GPU equal those hashed on the CPU, on --digest-ckpt
//      (default --ckpt; test/gpu/run.sh gives an 8 GiB one).
//   node test/gpu/gpu-check.mjs --ckpt DIR [--digest-ckpt DIR] [--work DIR] [--out FILE]
// Prints one line per check and the closing "N passed, N failed" line; exits non-zero on failure.
import { spawnSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { GpuFleet } from '../../bench/gpu/gpuFleet.mjs';
import { rankPlans } from '../../bench/gpu/rankPlans.mjs';
import { cudaProbe } from '../../dist/src/native/cuda.js';
import { DeviceHandle } from '../../dist/src/native/deviceHandle.js';

const { values: args } = parseArgs({
  options: { ckpt: { type: 'string' }, 'digest-ckpt': { type: 'string' }, work: { type: 'string', default: '/dev/shm/weightd-gpu-check' }, out: { type: 'string' } },
});
if (!args.ckpt) {
  console.error('usage: gpu-check.mjs --ckpt DIR [--digest-ckpt DIR] [--work DIR] [--out FILE]');
  process.exit(2);
}
const here = (f) => fileURLToPath(new URL(f, import.meta.url));
const checks = [];
function record(name, ok, details) {
  checks.push({ name, ok, details });
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${name} ${JSON.stringify(details)}`);
}
/** `fds` become the child's descriptors 3, 4, ... (inherited, as a received descriptor would be). */
function runJson(cmd, argv, fds = []) {
  const r = spawnSync(cmd, argv, { encoding: 'utf8', maxBuffer: 1 << 24, stdio: ['ignore', 'pipe', 'pipe', ...fds] });
  const last = r.stdout?.trim().split('\n').pop();
  try {
    return { status: r.status, result: JSON.parse(last), stderr: r.stderr };
  } catch {
    return { status: r.status ?? r.error?.message, result: null, stderr: r.stderr };
  }
}

mkdirSync(args.work, { recursive: true });
try {
  const probe = await cudaProbe();
  record('cudaProbe sees a GPU', probe.available, { reason: probe.reason, driverVersion: probe.driverVersion, devices: probe.devices.map((d) => `${d.uuid} ${d.name}`) });
  if (!probe.available) throw new Error('no GPU');

  // 1. tp=2, both ranks, as the daemon plans them.
  const tp = 2;
  const plans = await rankPlans(args.ckpt, tp);
  const planPaths = plans.map((p, rank) => {
    const path = join(args.work, `plan-tp${tp}-rank${rank}.json`);
    writeFileSync(path, JSON.stringify(p));
    return path;
  });
  const expectedPaths = plans.map((_, rank) => join(args.work, `expected-tp${tp}-rank${rank}.bin`));
  const slicer = runJson('python3', [here('./expected-slices.py'), ...planPaths.flatMap((p, i) => ['--plan', p, '--out', expectedPaths[i]])]);
  record('numpy wrote the expected tp=2 slices', slicer.status === 0, slicer.result ?? slicer.stderr);
  const strided = plans.map((p) => p.ops.filter((op) => op.rows > 1).length);
  // Two GPUs: one rank each, filling at once. One GPU: the ranks one after the other.
  const groups = probe.devices.length >= 2 ? [[0, 1]] : [[0], [1]];
  for (const ranks of groups) {
    const fleet = await GpuFleet.open(ranks.map((rank, k) => ({ index: k, plan: plans[rank], expectedPath: expectedPaths[rank] })));
    try {
      const modes = [{ mode: 'pread' }, { mode: 'register' }, { mode: 'pread', direct: true }, { mode: 'pread', threads: 3, chunkBytes: 5 << 20, stagingBytes: 16 << 20 }];
      // Both GPUs as one group too: one pass over the files, as the daemon fills a node's GPUs.
      for (const options of ranks.length > 1 ? [...modes, ...modes.map((m) => ({ ...m, group: true }))] : modes) {
        const filled = await fleet.fill(options);
        const verified = await fleet.all('verify');
        ranks.forEach((rank, k) => {
          const v = verified[k];
          record(`tp=2 rank ${rank} on GPU ${k} ${JSON.stringify(options)} is byte-exact`, v.mismatched === 0 && v.tensors === plans[rank].tensors.length,
            { ...v, stridedOps: strided[rank], seconds: filled.devices[k].seconds });
        });
      }
    } catch (err) {
      record(`tp=2 fill on ranks ${ranks}`, false, { code: err.code, message: err.message });
    } finally {
      await fleet.close();
    }
  }
  expectedPaths.forEach((p) => rmSync(p, { force: true }));

  // 2. IPC from other processes.
  const [plan1] = await rankPlans(args.ckpt, 1);
  const plan1Path = join(args.work, 'plan-tp1.json');
  writeFileSync(plan1Path, JSON.stringify(plan1));
  const device = new DeviceHandle('cuda', 0);
  let ipcFill;
  try {
    await device.allocate([plan1.segmentBytes]);
    ipcFill = await device.fill(plan1.files, plan1.ops, plan1.payloadBytes, {});
    const [segment] = device.exportSegments();
    record('export gives one 64-byte handle per segment', Buffer.from(segment.handle, 'base64').length === 64, { bytes: segment.bytes, fillSeconds: ipcFill.seconds });
    const py = runJson('python3', [here('./ipc-check.py'), '--handle', segment.handle, '--plan', plan1Path]);
    record('Python (ctypes cuIpcOpenMemHandle) reads the checkpoint bytes', py.status === 0 && py.result?.ok === true, py.result ?? py.stderr);
    const ts = runJson(process.execPath, [here('./ipc-client.mjs'), '--handle', segment.handle, '--plan', plan1Path]);
    record('TypeScript client (CudaIpcSegment) reads the checkpoint bytes', ts.status === 0 && ts.result?.ok === true, ts.result ?? ts.stderr);
  } finally {
    await device.free();
  }

  // 3. fd handles (VMM) from other processes, and adopted.
  record('the probe finds GPU 0 able to export VMM memory as descriptors', probe.devices[0].fdHandlesUnsupported === undefined, { why: probe.devices[0].fdHandlesUnsupported });
  const fdDevice = new DeviceHandle('cuda', 0, { cudaHandles: 'fd' });
  try {
    await fdDevice.allocate([plan1.segmentBytes]);
    const fdFill = await fdDevice.fill(plan1.files, plan1.ops, plan1.payloadBytes, {});
    const t0 = performance.now();
    const [segment] = fdDevice.exportSegments();
    const exportMs = performance.now() - t0;
    const again = fdDevice.exportSegments()[0];
    record('fd export gives one descriptor per segment, the same on every export', segment.handle === 'cuda-fd' && segment.fd >= 0 && again.fd === segment.fd,
      { handle: segment.handle, fd: segment.fd, bytes: segment.bytes, exportMs, fillSeconds: fdFill.seconds, ipcFillSeconds: ipcFill?.seconds });
    const py = runJson('python3', [here('./ipc-check.py'), '--fd', '3', '--bytes', String(segment.bytes), '--plan', plan1Path], [segment.fd]);
    record('Python (ctypes cuMemImportFromShareableHandle + map) reads the checkpoint bytes', py.status === 0 && py.result?.ok === true, py.result ?? py.stderr);
    const ts = runJson(process.execPath, [here('./ipc-client.mjs'), '--fd', '3', '--bytes', String(segment.bytes), '--plan', plan1Path], [segment.fd]);
    record('TypeScript client (CudaIpcSegment.openFd) reads the checkpoint bytes', ts.status === 0 && ts.result?.ok === true, ts.result ?? ts.stderr);
    const adopted = runJson(process.execPath, [here('./ipc-client.mjs'), '--adopt', '3', '--bytes', String(segment.bytes), '--plan', plan1Path], [segment.fd]);
    record('a device in another process adopts the descriptor and reads the checkpoint bytes; fill is refused there', adopted.status === 0 && adopted.result?.ok === true && adopted.result?.fillRefused === 'E_ADOPTED', adopted.result ?? adopted.stderr);
  } finally {
    await fdDevice.free();
  }
} catch (err) {
  record('gpu-check ran to the end', false, { message: err.message, stack: err.stack });
} finally {
  rmSync(args.work, { recursive: true, force: true });
}

// 4. The fill's GPU digests (native/cuda_digests.h) against its CPU digests, on --digest-ckpt:
// a tp=1 rank in pread and register mode and a tp=2 rank (whose row-parallel slices stay the
// CPU's), each filled twice on GPU 0, with digestOn 'gpu' (the addon's choice when a fill names
// none; the daemon's only with WEIGHTD_FILL_DIGESTS_ON=gpu) and 'cpu'. Each passes when both
// give every tensor the same digest, the GPU hashed (for tp=1: every tensor byte some copy moves;
// a tensor no op copies, such as a tied alias, is read again at the end) and the fill did not
// fall back to the CPU (digestGpuUnavailable). The CPU digests are held to Python's xxhash by the
// shared vectors (docs/spec/fingerprint.md §6). The seconds are a first look at the cost;
// bench/gpu/fill-digest.sh measures it.
const tensorBytes = (plan) => plan.tensorRanges.reduce((n, t) => n + (t.end - t.start), 0);
for (const { tp, mode } of [{ tp: 1, mode: 'pread' }, { tp: 1, mode: 'register' }, { tp: 2, mode: 'pread' }]) {
  const name = `GPU digests equal CPU digests: tp=${tp} rank 0, ${mode}`;
  let fleet;
  try {
    const plan = (await rankPlans(args['digest-ckpt'] ?? args.ckpt, tp))[0];
    fleet = await GpuFleet.open([{ index: 0, plan }]);
    const [gpu] = (await fleet.fill({ digest: true, mode })).devices;
    const [cpu] = (await fleet.fill({ digest: true, mode, digestOn: 'cpu' })).devices;
    const differ = plan.tensorRanges.map((_, i) => i).filter((i) => gpu.digests[i] !== cpu.digests[i]);
    const all = tensorBytes(plan);
    const ok = gpu.digests.length === plan.tensorRanges.length && differ.length === 0 && gpu.digestGpuBytes > 0 &&
      (tp > 1 || gpu.digestGpuBytes + gpu.digestRereadBytes === all) && !gpu.digestGpuUnavailable && cpu.digestGpuBytes === 0;
    record(name, ok, {
      tensors: plan.tensorRanges.length, tensorBytes: all, digestGpuBytes: gpu.digestGpuBytes, digestGpuUnavailable: gpu.digestGpuUnavailable,
      differ: differ.length, firstDiffering: differ.slice(0, 3).map((i) => ({ range: plan.tensorRanges[i], gpu: gpu.digests[i], cpu: cpu.digests[i] })),
      seconds: { gpu: gpu.seconds, cpu: cpu.seconds }, rereadBytes: { gpu: gpu.digestRereadBytes, cpu: cpu.digestRereadBytes },
    });
  } catch (err) {
    record(name, false, { error: `${err.code ?? ''} ${err.message}` });
  } finally {
    await fleet?.close();
  }
}

const failed = checks.filter((c) => !c.ok).length;
if (args.out) writeFileSync(args.out, JSON.stringify(checks, null, 1) + '\n');
console.log(`${checks.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
