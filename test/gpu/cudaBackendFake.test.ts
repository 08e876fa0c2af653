// The cuda backend's logic without a GPU: each scenario runs in a child process that loads
// test/gpu/fake-libcuda.c (built here with cc) as its libcuda.so.1. The fake queues copies until
// something waits for them and checks contexts, pinning and frees, so buffer reuse, ordering
// and cleanup mistakes show up as wrong bytes, errors or aborts. At exit the fake reports what
// is still allocated; every scenario must leave nothing behind.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { closeSync, constants, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { cudaDevices, cudaProbe } from '../../src/native/cuda.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { expectDaemonFailure, startDaemon } from '../helpers/daemon.js';
import { exampleModel, freshSocketDir } from '../helpers/paths.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const scenarioScript = fileURLToPath(new URL('./fakeDriverScenarios.js', import.meta.url));
const fakeDir = join(root, 'test', 'artifacts', 'fake-libcuda');

function buildFake(): void {
  mkdirSync(fakeDir, { recursive: true });
  const cc = spawnSync('cc', ['-shared', '-fPIC', '-O2', '-o', join(fakeDir, 'libcuda.so.1'), join(root, 'test', 'gpu', 'fake-libcuda.c'), '-lpthread'], { encoding: 'utf8' });
  if (cc.status !== 0) throw new Error(`cannot build the fake driver: ${cc.error?.message ?? cc.stderr}`);
}

interface Run {
  result: Record<string, unknown>;
  leaks: Record<string, number>;
}

/** `timeout` (ms) bounds a scenario that would otherwise hang for ever on a broken build. */
function scenario(name: string, env: Record<string, string> = {}, timeout?: number): Run {
  const child = spawnSync(process.execPath, [scenarioScript, name], {
    cwd: root,
    encoding: 'utf8',
    timeout,
    env: { ...process.env, LD_LIBRARY_PATH: fakeDir, FAKE_CUDA_REPORT: '1', FAKE_CUDA_DEVICES: '2', ...env },
  });
  assert.is(child.status, 0, `scenario ${name} failed: ${child.stderr}`);
  return { result: JSON.parse(child.stdout.trim().split('\n').pop()!), leaks: fakeLeaks(child.stderr) };
}

/** What the fake driver reported still allocated when the process ended (its stderr line). */
function fakeLeaks(stderr: string): Record<string, number> {
  const leakLine = stderr.split('\n').find((l) => l.startsWith('FAKE_CUDA_LEAKS '));
  assert.ok(leakLine, `the fake driver was not loaded: ${stderr}`);
  return JSON.parse(leakLine.slice('FAKE_CUDA_LEAKS '.length)) as Record<string, number>;
}

const MiB = 2 ** 20;
const noLeaks = { device: 0, pinned: 0, registered: 0, imported: 0, streams: 0, events: 0, contextRefs: 0, vmm: 0, reservations: 0, mappings: 0, vmmFds: 0, modules: 0 };
/** Where one fill's digest pieces were hashed (the digests scenario): bytes on each GPU, and why not more. */
interface Hashing {
  options: string;
  group: number[];
  alone: number;
  unavailable?: string;
  timed: (number | null)[][]; // per fill (group GPU 0, group GPU 1, alone): [setup, tail] seconds
}

test.before(buildFake);

test('without a driver: the probe says why and a cuda device fails with E_CUDA_UNAVAILABLE', async () => {
  const probe = await cudaProbe();
  if (probe.available) return; // a machine with a real GPU: covered by the GPU tests instead
  assert.match(probe.reason, /libcuda\.so\.1|GPU/);
  assert.equal(probe.devices, []);
  assert.equal(cudaDevices(probe), []);
  try {
    new DeviceHandle('cuda', 0);
    assert.unreachable('a cuda device opened without a driver');
  } catch (err) {
    assert.is((err as { code: string }).code, 'E_CUDA_UNAVAILABLE');
    assert.is((err as Error).name, 'DeviceError');
  }
});

test('probe lists each visible GPU with an nvidia-smi style UUID', () => {
  const { result, leaks } = scenario('probe');
  const probe = result.probe as { available: boolean; driverVersion: number; devices: { uuid: string; index: number }[] };
  assert.ok(probe.available);
  assert.is(probe.driverVersion, 13000);
  assert.is(probe.devices.length, 2);
  assert.is(probe.devices[1]!.uuid, 'GPU-10111213-1415-1617-1819-1a1b1c1d1e1f');
  assert.equal(result.slots, probe.devices.map((d) => ({ backend: 'cuda', index: d.index, uuid: d.uuid })));
  assert.equal(leaks, noLeaks);
});

test('fill is byte-exact in pread and register modes, buffered and O_DIRECT, contiguous and strided', () => {
  const { result, leaks } = scenario('fill');
  assert.is(result.runs, 6);
  assert.equal(leaks, noLeaks);
});

test('strided ops read only their rows where the gaps are worth skipping, alone and in a group, buffered and O_DIRECT, byte-exact', () => {
  const { result, leaks } = scenario('sparseReads');
  const runs = result.runs as Array<{ options: { direct?: boolean }; group: boolean; read: number; payload: number }>;
  assert.is(runs.length, 8);
  for (const r of runs) {
    const what = `${r.group ? 'group' : 'alone'} ${JSON.stringify(r.options)}: read ${r.read} bytes for a payload of ${r.payload}`;
    assert.ok(r.read >= r.payload, what);
    // Buffered reads are the rows themselves. O_DIRECT reads whole 4 KiB blocks: at most two
    // per row of these ops (510 rows alone, 300 runs in the group) beyond the rows' bytes.
    const blocks = r.group ? 300 : 510;
    assert.ok(r.read <= (r.options.direct ? r.payload + blocks * 2 * 4096 : r.payload * 1.05), what);
  }
  // The whole spans of these ops would be 6.8 MB alone and 4.9 MB in the group.
  assert.ok(runs.every((r) => r.read < (r.group ? 3e6 : 4.2e6)), JSON.stringify(runs));
  assert.equal(leaks, noLeaks);
});

test('O_DIRECT windows hold as many bytes as buffered ones, from tensors that start inside a block, byte- and digest-exact, reading no digest piece twice', () => {
  const copyLog = join(fakeDir, 'direct-windows-copies.log');
  const { result, leaks } = scenario('directWindows', { FAKE_CUDA_COPY_LOG: copyLog });
  const runs = result.runs as Array<{ chunkBytes: number; direct: boolean; copies: number[]; reread: number }>;
  assert.is(runs.length, 4);
  for (const r of runs) {
    const what = `${r.chunkBytes} byte chunks, ${r.direct ? 'O_DIRECT' : 'buffered'}: copies ${JSON.stringify(r.copies)}`;
    // A window holds a whole chunk of a tensor: the largest copy is exactly one chunk.
    assert.is(r.copies[0], r.chunkBytes, what);
    assert.is(r.reread, 0, what);
  }
  // O_DIRECT cuts the tensors into the same windows as buffered reads.
  for (const k of [0, 2]) assert.equal(runs[k + 1]!.copies, runs[k]!.copies, `${runs[k]!.chunkBytes} byte chunks`);
  assert.equal(leaks, noLeaks);
});

test('errors carry stable codes and say what to do; a cancelled fill leaves the device usable', () => {
  const { result, leaks } = scenario('errors');
  const codes = result as Record<string, string>;
  assert.match(codes.index!, /E_NO_DEVICE: .*sees 2 device/);
  assert.match(codes.uuid!, /E_DEVICE_MISMATCH: .*CUDA_VISIBLE_DEVICES/);
  assert.match(codes.fillBeforeAllocate!, /E_NOT_ALLOCATED/);
  assert.match(codes.tooBig!, /E_OUT_OF_MEMORY: .*needs 1\.56 GiB .*1\.00 GiB free/);
  assert.is(codes.freeDrop, String(18 * 1024 * 1024));
  assert.match(codes.twice!, /E_ALREADY_ALLOCATED/);
  assert.match(codes.badMode!, /RangeError.*'pread' or 'register'/);
  assert.match(codes.pastEnd!, /E_BAD_PLAN/);
  assert.match(codes.missingFile!, /E_FILE_OPEN/);
  assert.match(codes.outOfRange!, /E_OUT_OF_RANGE/);
  assert.match(codes.cancel!, /E_FILL_CANCELLED|no error/);
  assert.equal(leaks, noLeaks);
});

test('every cuda fill, in a group or alone and in every read mode, reports each tensor\'s full digest as the files hold it, reading no piece twice where its windows hold them all', () => {
  const { result, leaks } = scenario('digests', {}, 120_000);
  assert.is(result.runs, 4);
  assert.ok((result.tensors as number) > 10);
  // A group's windows pass every byte of the checkpoint, cut at digest piece starts: no piece is
  // read twice, with O_DIRECT too. A rank alone reads only its half of each sharded tensor.
  for (const r of result.rereads as { options: string; group: number[]; alone: number }[]) {
    assert.equal(r.group, [0, 0], `group with ${r.options}`);
    assert.ok(r.alone > 0, `alone with ${r.options}`);
  }
  // The fake runs no kernel here: hashed on the CPU, each fill saying why, except the one that asked.
  const hashing = result.hashing as Hashing[];
  for (const f of hashing.slice(0, -1)) {
    assert.equal([...f.group, f.alone], [0, 0, 0], f.options);
    assert.match(f.unavailable ?? '', /GPU digest kernel|cuModuleLoadData/, f.options);
    // No GPU hashed, so no GPU setup or wait is reported (absent, null through the scenario's JSON).
    assert.equal(f.timed, [[null, null], [null, null], [null, null]], f.options);
  }
  assert.equal(hashing.at(-1), { options: "{digestOn:'cpu'}", group: [], alone: 0 });
  assert.match(result.refused as string, /^digestOn must be 'gpu' or 'cpu', got 'tpu'$/);
  assert.equal(leaks, noLeaks);
});

test('with the digest kernel, each GPU hashes the pieces its contiguous copies land, behind them, and the digests are the files\'', () => {
  // The fake runs the kernel on the CPU when something waits for its stream: a launch that did
  // not wait for its window's copies would hash the fake's 0xEE bytes, and every digest would differ.
  const kernel = join(fakeDir, 'digest-kernel.fake');
  writeFileSync(kernel, 'any image: the fake driver loads it as the digest kernel\n');
  const { result, leaks } = scenario('digests', { FAKE_CUDA_KERNELS: '1', WEIGHTD_DIGEST_KERNEL: kernel }, 120_000);
  assert.is(result.runs, 4);
  const hashing = result.hashing as Hashing[];
  for (const f of hashing.slice(0, -1)) {
    assert.ok(f.group.every((bytes) => bytes > 0) && f.alone > 0, `${f.options}: ${JSON.stringify(f)}`);
    assert.is(f.unavailable, undefined, f.options);
    // Each fill says how long the kernel's setup took and how long it waited for the kernels
    // after its last copy (the fake runs them then, on the CPU: never no time).
    for (const [setup, tail] of f.timed) assert.ok(setup! > 0 && tail! > 0 && setup! < 60 && tail! < 60, `${f.options}: ${JSON.stringify(f.timed)}`);
  }
  assert.equal(hashing.at(-1), { options: "{digestOn:'cpu'}", group: [], alone: 0 });
  assert.equal(leaks, noLeaks);
});

test('the digest kernels are loaded once per CUDA context, by the warm-up ahead of the fills; a context made again after one ended loads its own, and its fills still hash on the GPU', () => {
  const kernel = join(fakeDir, 'digest-kernel.fake');
  writeFileSync(kernel, 'any image: the fake driver loads it as the digest kernel\n');
  const log = join(fakeDir, `modules-${process.pid}.log`);
  rmSync(log, { force: true });
  const { result, leaks } = scenario('digestKernelsKept', { FAKE_CUDA_KERNELS: '1', WEIGHTD_DIGEST_KERNEL: kernel, FAKE_CUDA_MODULE_LOG: log }, 120_000);
  // "device generation": GPU 0's first context, loaded by the warm-up, then its second.
  assert.equal(result.loads, { afterWarm: ['0 1'], afterFills: ['0 1'], afterAgain: ['0 1', '0 2'] });
  assert.equal(result.onGpu, [true, true, true, true]);
  assert.is(result.digestsEqual, true);
  assert.equal(leaks, noLeaks);
});

test('two GPUs filled as one group get byte-exact shards in every mode, from file lists in any order', () => {
  const { result, leaks } = scenario('group');
  assert.is(result.runs, 5);
  assert.equal(leaks, noLeaks);
});

test('group failures: sizes that disagree, a member cancelled while waiting, a bad op fails both and names its GPU; a member that leaves (it adopted) lets the other fill alone', () => {
  const { result, leaks } = scenario('groupErrors');
  const codes = result as Record<string, string>;
  assert.match(codes.sizes!, /^DeviceError E_BAD_GROUP: fill group sizes: joined as one of 3 members, but it has 2/);
  assert.match(codes.cancelWhileWaiting!, /^DeviceError E_FILL_CANCELLED: /);
  assert.match(codes.lateMember!, /^DeviceError E_FILL_CANCELLED: fill group sizes: GPU 0 \(GPU-[0-9a-f-]+\) was cancelled before the group's fill started/);
  assert.is(codes.reused, 'no error', 'an id every member has been told about is forgotten');
  assert.match(codes.lonelyRecent!, /^DeviceError E_FILL_CANCELLED: fill group lonely-16: GPU 0/);
  assert.is(codes.lonelyOldest, 'no error', 'only the 16 most recently abandoned groups are remembered');
  // The bad op is GPU 1's; both members fail, and both messages name GPU 1.
  assert.match(codes.badOpOwn!, /^DeviceError E_BAD_PLAN: GPU 1 \(GPU-[0-9a-f-]+\): copy op 5 reads past the end of/);
  assert.is(codes.badOpOther, codes.badOpOwn!.replace('E_BAD_PLAN: ', "E_BAD_PLAN: the fill shared by this node's GPUs failed: "));
  assert.is(codes.leftFirst, 'no error', 'the leave came before the other member joined');
  assert.is(codes.leftLater, 'no error', 'the leave came while the other member waited');
  assert.equal(leaks, noLeaks);
});

test('an asynchronous copy fault names the GPU it happened on, alone and in a group', () => {
  const { result, leaks } = scenario('asyncFault', { FAKE_CUDA_FAULT_DEVICE: '1' });
  const codes = result as Record<string, string>;
  const own = /^DeviceError E_CUDA\S*: GPU 1 \(GPU-[0-9a-f-]+\): cuEventSynchronize.*CUDA_ERROR_ILLEGAL_ADDRESS/;
  assert.match(codes.groupOwn!, own);
  assert.match(codes.alone!, own);
  assert.match(codes.groupOther!, /^DeviceError E_CUDA\S*: the fill shared by this node's GPUs failed: GPU 1 \(GPU-[0-9a-f-]+\): cuEventSynchronize/);
  assert.is(codes.healthy, 'no error');
  assert.equal(leaks, noLeaks);
});

test('a segment over 2 GiB is copied out whole by another process (the client copy() path)', () => {
  const { result, leaks } = scenario('bigCopy', { FAKE_CUDA_MEM_MB: '3072' });
  assert.equal(result, { bytes: 2 ** 31 + 2 ** 28, arrived: [true, true, true] });
  assert.equal(leaks, noLeaks);
});

test('the daemon at tp=2 fills both GPUs as one group; a rank failing around its fill takes the node down at once, leaving nothing', () => {
  const { result, leaks } = scenario('daemonGroup');
  const loaded = result.loaded as { state: string; bytes: number; totalBytes: number }[];
  assert.is(loaded.length, 2);
  for (const r of loaded) {
    assert.is(r.state, 'serving');
    assert.ok(r.totalBytes > 0 && r.bytes === r.totalBytes, `every byte landed: ${JSON.stringify(r)}`);
  }
  assert.is(result.stopped, 'stopped');
  for (const [name, f] of Object.entries(result.faults as Record<string, { state: string; message?: string; ms: number }>)) {
    assert.is(f.state, 'failed', name);
    assert.match(f.message ?? '', /^rank [01] \(local [01]\) failed: /, name);
    // Either rank may report first; what failed is rank 1's.
    assert.match(f.message ?? '', name === 'fill-device' ? /GPU 1 \(GPU-[0-9a-f-]+\): cannot open checkpoint file .*\.missing/ : /rank 1/, name);
    // Rank 0 either never started its fill or was waiting in the group: it must not hang there.
    assert.ok(f.ms < 15_000, `${name} took ${f.ms} ms`);
  }
  assert.equal(leaks, noLeaks);
});

test('a padded vllm plan: zero ranges read back as zero on non-zero fake memory, other bytes equal the checkpoint, the daemon serves it', () => {
  const { result, leaks } = scenario('padding');
  // 48 padding rows of 16 bf16 values, in the embedding and in lm_head, on rank 1 only.
  assert.equal(result.zeroBytes, [0, 2 * 48 * 16 * 2]);
  assert.is(result.untouched, true, 'only the ranges are zeroed');
  assert.match(result.outside as string, /^DeviceError E_BAD_PLAN: GPU 0 .*zero range 0 \(2 bytes at 1048575 of segment 0\) is outside the arena/);
  assert.match(result.segment as string, /^RangeError : zero range 0 segment index 4294967296 is past 2\^32-1/);
  assert.equal(result.daemon, { state: 'serving,serving' });
  assert.equal(leaks, noLeaks);
});

test('a failing memset is a named error that fails the rank and the node, leaving nothing allocated', () => {
  const { result, leaks } = scenario('paddingMemsetFails', { FAKE_CUDA_FAIL_MEMSET: '1' });
  const named = /E_CUDA.*GPU 1 \(GPU-[0-9a-f-]+\): zeroing padding range 0 \(1536 bytes at \d+ of segment 0\): cuMemsetD32Async failed: CUDA_ERROR_INVALID_VALUE/;
  assert.match(result.alone as string, named);
  const daemon = result.daemon as { state: string; message?: string };
  assert.is(daemon.state, 'failed');
  assert.match(daemon.message ?? '', /^rank 1 \(local 1\) failed: .*zeroing padding range 0 .*cuMemsetD32Async failed/);
  assert.equal(leaks, noLeaks);
});

test('blocking calls leave the JS thread free: a probe and reads held in the driver; free() during a read waits for it', () => {
  const gates = mkdtempSync(join(fakeDir, 'gates-'));
  try {
    const env = { FAKE_CUDA_INIT_GATE: join(gates, 'init'), FAKE_CUDA_DTOH_GATE: join(gates, 'dtoh') };
    for (const fifo of Object.values(env)) execFileSync('mkfifo', [fifo]);
    // A call that blocked the JS thread would wait at a gate that only the JS thread can open.
    const { result, leaks } = scenario('inFlight', env, 60_000);
    const busy = 'DeviceError E_DEVICE_BUSY: an allocate, read or free is still running on this device; await it before the next call';
    assert.equal(result, {
      available: true,
      zeros: true,
      settled: ['read', 'freed'],
      readAfterFree: 'DeviceError E_OUT_OF_RANGE: read of 1 bytes at 0 is outside segment 0',
      busy: { free: busy, info: busy, read: busy },
    });
    assert.equal(leaks, noLeaks);
  } finally {
    rmSync(gates, { recursive: true, force: true });
  }
});

test('IPC: another process opens the exported handle, reads the same bytes, opens are counted, a close waits for a read', () => {
  const { result, leaks } = scenario('ipc', {}, 60_000);
  assert.is(result.sameProcess, 'E_CUDA');
  const { closeDuringRead, ...client } = result.client as { closeDuringRead: { landed: boolean; after: string } };
  assert.equal(client, { equal: true, bytes: 12 * 1024 * 1024, samePointer: true, outOfRange: 'E_OUT_OF_RANGE', stillOpen: true, afterClose: 'E_NOT_OPEN' });
  assert.is(closeDuringRead.landed, true);
  assert.match(closeDuringRead.after, /^DeviceError E_NOT_OPEN: CUDA IPC segment 0x[0-9a-f]+ of device 0 is closed; open it again/);
  assert.equal(leaks, noLeaks);
});

test('fd handles: VMM segments fill byte-exact and export descriptors; a second device, a child process and the TypeScript client map them and read the same bytes', () => {
  const { result, leaks } = scenario('vmm', {}, 60_000);
  // 12 MiB and 6 MiB: whole 2 MiB granules already, so VMM holds exactly the planned bytes.
  assert.is(result.held, 18 * MiB);
  assert.equal(result.handles, ['cuda-fd', 'cuda-fd']);
  assert.equal(result.bytes, [12 * MiB, 6 * MiB]);
  assert.is(result.sameFds, true, 'a second export hands out the same descriptors, not new ones');
  assert.equal(result.adoptedHandles, ['cuda-fd', 'cuda-fd']);
  assert.match(result.fillAdopted as string, /^DeviceError E_ADOPTED: GPU 1 \(GPU-[0-9a-f-]+\) holds an adopted arena/);
  assert.equal(result.fdsClosedByFree, ['EBADF', 'EBADF']);
  const client = result.client as { equal: boolean; withoutFds: string; closedByOpen: string[]; access: string };
  assert.equal(client.closedByOpen, ['EBADF', 'EBADF'], 'openCuda closes the descriptors it was given, as openHost does');
  assert.is(client.equal, true, 'the TypeScript client reads the same bytes through the descriptors');
  assert.is(client.access, 'r--s', 'the TypeScript client maps the daemon\'s memory read-only');
  assert.match(client.withoutFds, /^ProtocolError E_NO_SEGMENT_FDS: rank 0 serves 2 cuda-fd segment\(s\), whose descriptors come from get_segment_fds/);
  assert.is(result.freeAfter, true);
  assert.equal(result.child, { equal: true, leaks: noLeaks });
  assert.equal(leaks, noLeaks);
});

for (const onGpu of [false, true]) {
  test(`a writer's segments: a staging copy of a served segment, then a final copy of it whose digests (${onGpu ? 'the digest kernel\'s' : 'read back a window at a time'}) are the files' and which a device adopts, leaving nothing`, () => {
    const kernel = join(fakeDir, 'digest-kernel.fake');
    writeFileSync(kernel, 'any image: the fake driver loads it as the digest kernel\n');
    const { result, leaks } = scenario('updateSegments', onGpu ? { FAKE_CUDA_KERNELS: '1', WEIGHTD_DIGEST_KERNEL: kernel } : {}, 120_000);
    assert.equal(result, { sharedFd: -1, digestsEqual: true, digests: 3, onGpu, finalBytes: true });
    assert.equal(leaks, noLeaks);
  });
}

test('a writer\'s partial update: the version it makes shares its unwritten segment with the base as the same memory, by name, and its written one is memory of its own (so eviction counts shared memory once), leaving nothing', () => {
  const { result, leaks } = scenario('writtenSharesMemory', {}, 120_000);
  assert.equal(result, { sharedIsTheBase: true, writtenIsItsOwn: true, baseDistinct: true });
  assert.equal(leaks, noLeaks);
});

test('a writer\'s commit on cuda hashes where its rank\'s fill does (ServedRankData.digestOn), not where WEIGHTD_FILL_DIGESTS_ON says at the commit: \'cpu\' on the CPU though the digest kernel loads, \'gpu\' with the variable at cpu on the GPU, the same digests either way', () => {
  const kernel = join(fakeDir, 'digest-kernel.fake');
  writeFileSync(kernel, 'any image: the fake driver loads it as the digest kernel\n');
  const { result, leaks } = scenario('updateDigestsOn', { FAKE_CUDA_KERNELS: '1', WEIGHTD_DIGEST_KERNEL: kernel }, 120_000);
  assert.equal(result, { hashedOn: ['cpu', 'gpu'], digests: 2, sameDigests: true });
  assert.equal(leaks, noLeaks);
});

test('a processed layout\'s commit on cuda hashes where its rank\'s fill does: \'cpu\' on the CPU though the digest kernel loads, \'gpu\' on the GPU, the same digests', () => {
  const kernel = join(fakeDir, 'digest-kernel.fake');
  writeFileSync(kernel, 'any image: the fake driver loads it as the digest kernel\n');
  const { result, leaks } = scenario('publishDigestsOn', { FAKE_CUDA_KERNELS: '1', WEIGHTD_DIGEST_KERNEL: kernel }, 120_000);
  assert.equal(result, { hashedOn: ['cpu', 'gpu'], sameDigests: true });
  assert.equal(leaks, noLeaks);
});

test('fill.digestOn given to startNode in code (no WEIGHTD_FILL_DIGESTS_ON) reaches a writer\'s commit: it hashes on the CPU though the digest kernel loads', () => {
  const kernel = join(fakeDir, 'digest-kernel.fake');
  writeFileSync(kernel, 'any image: the fake driver loads it as the digest kernel\n');
  const { result, leaks } = scenario('nodeDigestsOn', { FAKE_CUDA_KERNELS: '1', WEIGHTD_DIGEST_KERNEL: kernel }, 120_000);
  assert.equal(result, { sealed: ['cpu'] });
  assert.equal(leaks, noLeaks);
});

test('a writer\'s commit failing midway (the shared segment\'s import, after the final copy was queued) drains the copy before unmapping, and leaves nothing', () => {
  // Imports: the staging copy's source (1), then at commit the staging (2) and the shared segment (3).
  const { result, leaks } = scenario('updateSegments', { FAKE_CUDA_VMM_FAIL: 'cuMemImportFromShareableHandle:3' }, 120_000);
  assert.match(result.commitFailed as string, /^DeviceError E_OUT_OF_MEMORY: cuMemImportFromShareableHandle failed/);
  assert.equal(leaks, noLeaks);
});

for (const failing of ['cuMemCreate:2', 'cuMemAddressReserve:3', 'cuMemMap:2', 'cuMemSetAccess:3']) {
  test(`fd handles: ${failing} failing midway through an allocation gives back every segment and step made so far`, () => {
    const { result, leaks } = scenario('vmmFailure', { FAKE_CUDA_VMM_FAIL: failing });
    assert.match(result.failed as string, new RegExp(`^DeviceError E_OUT_OF_MEMORY: GPU 0 \\(GPU-[0-9a-f-]+\\): ${failing.split(':')[0]} failed: CUDA_ERROR_OUT_OF_MEMORY`));
    assert.is(result.freeAfterFailure, true);
    assert.is(result.exported, 'no error');
    assert.equal(leaks, noLeaks);
  });
}

test('fd handles: a failed export leaves nothing behind either', () => {
  const { result, leaks } = scenario('vmmFailure', { FAKE_CUDA_VMM_FAIL: 'cuMemExportToShareableHandle:2' });
  assert.is(result.failed, 'no error');
  assert.match(result.exported as string, /^DeviceError E_OUT_OF_MEMORY: GPU 0 .*cuMemExportToShareableHandle failed/);
  assert.equal(leaks, noLeaks);
});

test('fd handles: adopt refuses what is not one exported segment per size, names the segment, and closes every descriptor it was given', () => {
  const { result, leaks } = scenario('vmmAdoptErrors');
  const { codes, closed } = result as { codes: Record<string, string>; closed: Record<string, string> };
  assert.match(codes.notVmm!, /^DeviceError E_CUDA: GPU 0 .*adopting segment 0 \(descriptor \d+, 1048576 bytes\): cuMemImportFromShareableHandle failed: .*--cuda-handles fd/);
  assert.match(codes.tooBig!, /^DeviceError E_CUDA: GPU 0 .*adopting segment 0 .*cuMemMap failed/);
  assert.match(codes.counts!, /^DeviceError E_BAD_ADOPT: adopt got 2 descriptor\(s\) for 1 segment size\(s\)/);
  assert.match(codes.secondBad!, /adopting segment 1 .*cuMemImportFromShareableHandle failed/);
  assert.match(codes.allocated!, /^DeviceError E_ALREADY_ALLOCATED: /);
  assert.equal(closed, { notVmm: 'EBADF', tooBig: 'EBADF', counts: 'EBADF,EBADF', secondBad: 'EBADF,EBADF', allocated: 'EBADF' });
  assert.equal(leaks, noLeaks);
});

test('fd handles, context deferred: adopt holds the descriptors with no context and exports them as given; the first read checks (imports) them, making the context; a failed check names the segment and keeps the descriptors open until free', () => {
  const { result, leaks } = scenario('vmmDeferred');
  const r = result as Record<string, unknown>;
  assert.equal(r.beforeCheck, { contexts: 0, freeProbed: false, exportsGiven: true });
  assert.equal(r.afterRead, { contexts: 1, freeProbed: true });
  assert.is(r.closedByFree, 'EBADF,EBADF');
  assert.match(r.checkError as string, /^DeviceError E_CUDA: GPU 0 .*adopting segment 1 \(descriptor \d+, 1048576 bytes\): cuMemImportFromShareableHandle failed: .*--cuda-handles fd/);
  assert.is(r.heldAfterFailure, 'open,open', 'the numbers a server may still hold are never freed for reuse before free()');
  assert.is(r.badClosedByFree, 'EBADF,EBADF');
  assert.equal(leaks, noLeaks);
});

test("a process's CUDA probes, at once or later, describe each device to the driver once: the devices are fixed at cuInit", () => {
  const queryLog = join(fakeDir, 'probed-once-queries.log');
  rmSync(queryLog, { force: true });
  const { result, leaks } = scenario('probedOnce', { FAKE_CUDA_QUERY_LOG: queryLog });
  assert.equal(result, { same: true, devices: 2, described: ['0', '1'] });
  assert.equal(leaks, noLeaks);
});

test('fd handles on a GPU that cannot export descriptors: the probe says why, an fd device refuses to open naming the flag, ipc still works', () => {
  const { result, leaks } = scenario('vmmUnsupported', { FAKE_CUDA_NO_FD_HANDLES: '1' });
  assert.match(result.reason as string, /cannot export memory as a POSIX file descriptor/);
  assert.match(result.open as string, /^DeviceError E_CUDA_HANDLES_UNSUPPORTED: GPU 0 .*cannot serve --cuda-handles fd: .*; use --cuda-handles ipc/);
  assert.match(result.badOption as string, /^DeviceError E_BAD_OPTION: cudaHandles 'posix' is not a kind of CUDA handle; use 'ipc' or 'fd'/);
  assert.is(result.ipc, 'no error');
  assert.equal(leaks, noLeaks);
});

test('the daemon with --cuda-handles fd fills both GPUs as one group into VMM memory; the TypeScript client copies and attaches through get_segment_fds; nothing is left', () => {
  const { result, leaks } = scenario('daemonFd', {}, 60_000);
  // While serving, per rank's one segment: the fake driver's own memfd and the daemon's exported
  // descriptor; a descriptor the client kept would make it more.
  assert.equal(result, { states: ['serving', 'serving'], handles: ['cuda-fd'], mismatched: [], fdsLeft: 4 });
  assert.equal(leaks, noLeaks);
});

test('a partial update on cuda shares its base\'s allocations under the same name, so eviction counts them once: the base alone frees only its written segment, so both versions go', () => {
  const { result, leaks } = scenario('cudaSharedEviction', {}, 120_000);
  const { versions, sameMemory, evicted } = result as { versions: number[]; sameMemory: boolean[]; evicted: unknown };
  assert.equal(versions, [0, 1]);
  assert.ok(sameMemory.length > 2, 'the plan file cuts the arena into several segments');
  assert.equal(sameMemory, sameMemory.map((_, i) => i !== 1), 'every segment but the written one is the same memory in both versions');
  assert.equal(evicted, [0, 1]);
  assert.equal(leaks, noLeaks);
});

// The kernel loadable or not, and loadable with WEIGHTD_FILL_DIGESTS_ON=cpu, which verify follows as a fill does, or with the request's digestOn 'cpu'.
const verifyHashing = [
  { hashing: 'by the digest kernel', kernel: true, onCpu: [] },
  { hashing: 'read back to the host, no kernel', kernel: false, onCpu: [/: no GPU digest kernel at /] },
  {
    hashing: "read back to the host, the kernel file another version's source built (its jobs laid out otherwise)",
    kernel: 'other-layout',
    onCpu: [/: the GPU digest kernel file has no kernel weightd_xxh3_pieces_j32: it was built from another version's source; rebuild it with native\/gpu\/build-kernel\.sh$/],
  },
  { hashing: 'read back to the host, as WEIGHTD_FILL_DIGESTS_ON=cpu asks', kernel: true, cpu: true, onCpu: [/: WEIGHTD_FILL_DIGESTS_ON=cpu$/] },
  { hashing: "read back to the host, as the request's digestOn 'cpu' asks", kernel: true, option: 'cpu', onCpu: [/: digestOn 'cpu'$/] },
];
for (const { hashing, kernel: loadable, cpu, option, onCpu } of verifyHashing) {
  test(`weightd verify of a cuda written version digests its allocations (${hashing}) against the commit's digests, and names the tensor whose byte was flipped in device memory`, () => {
    const kernel = join(fakeDir, 'digest-kernel.fake');
    writeFileSync(kernel, 'any image: the fake driver loads it as the digest kernel\n');
    const env = { ...(loadable ? { FAKE_CUDA_KERNELS: loadable === true ? '1' : loadable, WEIGHTD_DIGEST_KERNEL: kernel } : {}), ...(cpu ? { WEIGHTD_FILL_DIGESTS_ON: 'cpu' } : {}), ...(option ? { SCENARIO_VERIFY_DIGEST_ON: option } : {}) };
    const { result, leaks } = scenario('cudaVerifyWritten', env, 120_000);
    const { tensor, intact, flipped } = result as { tensor: string; intact: { code: number; lines: string[] }; flipped: { code: number; lines: string[] } };
    assert.is(intact.code, 0, intact.lines.join('\n'));
    const saidCpu = intact.lines.filter((l) => l.startsWith('verify: digests hashed on the CPU, read back from the GPU'));
    assert.is(saidCpu.length, onCpu.length, intact.lines.join('\n'));
    onCpu.forEach((why, i) => assert.match(saidCpu[i]!, why));
    assert.match(intact.lines.at(-1)!, /all \d+ tensors of version 1 of model "tiny-llama" \(written, no files: the daemon's memory digested against the digests its commit recorded\) are as committed/);
    assert.is(flipped.code, 1, flipped.lines.join('\n'));
    const differing = flipped.lines.filter((l) => / differs: /.test(l));
    assert.equal(differing.map((l) => /tensor (\S+) differs/.exec(l)?.[1]), [tensor], 'exactly the flipped tensor is named');
    assert.match(flipped.lines.at(-1)!, /1 of \d+ tensors of version 1 of model "tiny-llama" differ from what its commit recorded/);
    assert.equal(leaks, noLeaks);
  });
}

test('a cuda written version kept by the keeper is restored at a restart, current, with its bytes, and still shares its base\'s allocations under their names, so eviction counts them once', () => {
  const { result, leaks } = scenario('cudaWrittenRestart', {}, 180_000);
  const { versions, mismatched, sameMemory, evicted } = result as { versions: unknown; mismatched: string[]; sameMemory: boolean[]; evicted: unknown };
  assert.equal(versions, [[0, false, 'keeper'], [1, true, 'keeper']]);
  assert.equal(mismatched, [], 'the written tensor reads what was written, the others the checkpoint\'s bytes');
  assert.ok(sameMemory.length > 2, 'the plan file cuts the arena into several segments');
  assert.equal(sameMemory, sameMemory.map((_, i) => i !== 1), 'every segment but the written one is the same memory in both versions');
  assert.equal(evicted, [0, 1]);
  assert.equal(leaks, noLeaks);
});

test('--cuda-handles fd with a keeper: a restarted node adopts both GPUs\' VMM memory from the keeper and serves the same bytes; nothing is left', () => {
  const { result, leaks } = scenario('daemonFdRestart', {}, 60_000);
  assert.equal(result, { sources: ['keeper', 'keeper'], kept: [true, true], mismatched: [] });
  assert.equal(leaks, noLeaks);
});

test('--cuda-handles fd with a keeper, one rank\'s record dropped: the other adopts and leaves the node\'s fill group, so the rank that fills does not wait for it; both serve the same bytes, nothing is left', () => {
  const { result, leaks } = scenario('daemonFdRestartOneDropped', {}, 60_000);
  assert.equal(result, { sources: ['keeper', 'checkpoint'], kept: [true, true], mismatched: [] });
  assert.equal(leaks, noLeaks);
});

/**
 * The restarts that hold their descriptors' checks at a gate run the daemon and its clients in one
 * process, whose libuv threads the held calls occupy: the two ranks' checks, and each client's
 * get_segment_fds and begin_update, a thread each while they wait for a reply (the addon's
 * unixRequest). With libuv's default 4, one of them would wait for a thread until the gate opened.
 */
const HELD_CHECKS = { UV_THREADPOOL_SIZE: '8' };

test('--cuda-handles fd with a keeper: a restart adopts on the main thread and is READY with no CUDA context; a client\'s descriptors wait for the check after READY, then serve the same bytes; nothing is left', () => {
  const { result, leaks } = scenario('daemonFdRestartHere', HELD_CHECKS, 60_000);
  const unchecked = { adoptedOn: 'main', descriptors: 'checking', freeProbed: false };
  const checked = { adoptedOn: 'main', descriptors: 'checked', freeProbed: true };
  assert.equal(result, {
    atReady: { contexts: 0, ranks: [unchecked, unchecked], metric: [0, 0] },
    waitedForCheck: true,
    copied: ['copied', 'copied'],
    mismatched: [],
    // One per rank's check; the client's own imports (this process) retain the same two.
    afterCheck: { contexts: 4, ranks: [checked, checked], metric: [1, 1] },
  });
  assert.equal(leaks, noLeaks);
});

test('a kept record whose descriptors are another GPU\'s allocations: READY, then the client waiting for them and an update begun from them are refused (E_ADOPT_CHECK_FAILED), the shard is dropped and the node fails by that name; nothing is left', () => {
  const { result, leaks } = scenario('daemonFdRestartCorrupt', HELD_CHECKS, 60_000);
  const r = result as { atReady: unknown; waitedForCheck: boolean; copied: string[]; update: string; ended: string; failure: string; stillKept: boolean[] };
  assert.equal(r.atReady, { contexts: 0, ranks: [{ adoptedOn: 'main', descriptors: 'checking', freeProbed: false }, { adoptedOn: 'main', descriptors: 'checking', freeProbed: false }], metric: [0, 0] });
  // On a failure, what settled while the check was held at the gate.
  assert.ok(r.waitedForCheck, JSON.stringify({ copied: r.copied, update: r.update, failure: r.failure }));
  // GPU 0's client, waiting for the check, is refused by name; GPU 1's passed its check, and its
  // copy races the node's failure (copied, or the socket gone: "load from disk").
  assert.is(r.copied[0], 'E_ADOPT_CHECK_FAILED');
  assert.is(r.update, 'E_ADOPT_CHECK_FAILED', 'an update begun from GPU 0\'s shard while it was checked copies nothing of it');
  assert.ok(['copied', 'E_CONNECT', 'E_DISCONNECTED'].includes(r.copied[1]!), r.copied[1]);
  assert.is(r.ended, 'failed');
  assert.is(r.failure, 'E_ADOPT_CHECK_FAILED');
  assert.equal(r.stillKept, [false], 'GPU 1\'s shard stays kept; GPU 0\'s is dropped');
  assert.equal(leaks, noLeaks);
});

test('--cuda-handles fd on GPUs that cannot export descriptors exits 2 naming the flag, before loading', async () => {
  const env = { LD_LIBRARY_PATH: fakeDir, FAKE_CUDA_REPORT: '1', FAKE_CUDA_DEVICES: '2', FAKE_CUDA_NO_FD_HANDLES: '1' };
  const socketDir = freshSocketDir();
  try {
    const failed = await expectDaemonFailure({ model: exampleModel, tp: 2, device: 'cuda', socketDir, env, extraArgs: ['--cuda-handles', 'fd'] });
    assert.is(failed.code, 2, failed.stderr);
    assert.match(failed.stderr, /--cuda-handles fd: GPU 0 \(GPU-[0-9a-f-]+\): the GPU or its driver cannot export memory as a POSIX file descriptor; use --cuda-handles ipc/);
    assert.equal(fakeLeaks(failed.stderr), noLeaks);
  } finally {
    rmSync(socketDir, { recursive: true, force: true });
  }
});

test('the command line warms CUDA while it starts, and gives the warm-up contexts back: after READY and a stop, and after a failed start', async () => {
  const env = { LD_LIBRARY_PATH: fakeDir, FAKE_CUDA_REPORT: '1', FAKE_CUDA_DEVICES: '2' };
  const socketDirs = [freshSocketDir(), freshSocketDir()];
  try {
    const daemon = await startDaemon({ model: exampleModel, tp: 2, device: 'cuda', socketDir: socketDirs[0], env });
    // The warm-up also pinned the fill's staging, which the fill took instead of pinning its own.
    const staging = daemon.stderr().split('\n').filter((l) => l.includes("fill's staging")).map((l) => JSON.parse(l) as { stagingPinnedAhead?: boolean });
    assert.equal(staging.map((l) => l.stagingPinnedAhead), [true, true], daemon.stderr());
    const stopped = await daemon.stop();
    assert.is(stopped.code, 0, daemon.stderr());
    assert.equal(fakeLeaks(daemon.stderr()), noLeaks);
    // Four local ranks on two GPUs: the warm-up took both contexts before the start failed.
    const failed = await expectDaemonFailure({ model: exampleModel, tp: 4, device: 'cuda', socketDir: socketDirs[1], env });
    assert.ok(failed.code !== 0 && /E_DEVICE_COUNT/.test(failed.stderr), failed.stderr);
    assert.equal(fakeLeaks(failed.stderr), noLeaks);
  } finally {
    for (const d of socketDirs) rmSync(d, { recursive: true, force: true });
  }
});

/**
 * Opens the FIFO `gate` for writing once a reader holds it open (the fake's cuInit, waiting at
 * it), or rejects once `exited` settles first: a process that ended will never read it.
 */
async function openWhenRead(gate: string, exited: Promise<unknown>): Promise<number> {
  let ended = false;
  void exited.then(() => (ended = true));
  for (;;) {
    try {
      return openSync(gate, constants.O_WRONLY | constants.O_NONBLOCK);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENXIO') throw err;
    }
    if (ended) throw new Error(`the process ended and nothing read ${gate}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

test("./weightd begins the CUDA driver's start before the bundle loads, for a daemon's arguments only; a refused flag's exit code holds while it is in flight", async () => {
  const launcher = join(root, 'weightd');
  const gates = mkdtempSync(join(fakeDir, 'gates-'));
  const env = { ...process.env, LD_LIBRARY_PATH: fakeDir, FAKE_CUDA_REPORT: '1', FAKE_CUDA_DEVICES: '2' };
  try {
    // A flag the command line refuses: main.ts warms no CUDA for it, so the cuInit that waits at
    // the gate is the launcher's. The command line refuses the flag meanwhile; the process must
    // still wait for cuInit, then exit 2, not be ended by a signal as if a thread were blocked.
    const gate = join(gates, 'init');
    execFileSync('mkfifo', [gate]);
    const child = spawn(launcher, ['--model', exampleModel, '--no-such-flag'], { env: { ...env, FAKE_CUDA_INIT_GATE: gate }, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
    const fd = await openWhenRead(gate, exited);
    // Held until the refusal is written: the exit waits for the thread, however long it takes.
    while (!stderr.includes('no-such-flag')) await new Promise((resolve) => setTimeout(resolve, 5));
    writeSync(fd, 'x');
    closeSync(fd);
    assert.equal(await exited, { code: 2, signal: null }, stderr);
    assert.equal(fakeLeaks(stderr), noLeaks);
    // A command that is a word, --version, and a daemon on the host backend: no driver loaded (the
    // fake reports at exit only where it was loaded).
    for (const args of [['--version'], ['ctl', 'list', '--weight-cache-socket-dir', gates], ['--model', exampleModel, '--device', 'host', '--no-such-flag']]) {
      const r = spawnSync(launcher, args, { env, encoding: 'utf8' });
      assert.ok(r.status !== null && !r.stderr.includes('FAKE_CUDA_LEAKS'), `weightd ${args.join(' ')} loaded the driver (exit ${r.status}): ${r.stderr}`);
    }
  } finally {
    rmSync(gates, { recursive: true, force: true });
  }
});

test.run();
