// Child process of cudaBackendFake.test.ts: runs one scenario of the cuda backend against the
// fake driver (fake-libcuda.c, found through LD_LIBRARY_PATH, which must be set before the
// process starts: the driver is loaded once per process). Prints one JSON line: the result.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, fstatSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, readlinkSync, readSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { dirname, join } from 'node:path';
import pino from 'pino';
import { fileURLToPath } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { diskDigests } from '../../src/native/diskDigests.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { verifyWritten } from '../../src/cli/verifyWritten.js';
import { planEviction } from '../../src/models/evictionPolicy.js';
import { poolOf } from '../../src/models/modelFit.js';
import type { CopyOp, ZeroRange } from '../../src/checkpoint/types.js';
import { addon } from '../../src/native/addon.js';
import { packTensorRanges } from '../../src/native/fillRecords.js';
import { cudaDevices, cudaProbe, CudaIpcSegment } from '../../src/native/cuda.js';
import { DeviceHandle, type FillProgress } from '../../src/native/deviceHandle.js';
import type { SegmentExport } from '../../src/native/addon.js';
import { rankPhases } from '../../src/actors/rankPhases.js';
import type { RankWorkerData } from '../../src/models/rankMessages.js';
import { RankService } from '../../src/serve/rankService.js';
import { UpdateDesk } from '../../src/serve/updateDesk.js';
import { PUBLISH_BACKENDS } from '../../src/serve/publishDesk.js';
import { startNode } from '../../src/startNode.js';
import { openCuda } from '../../src/client/segmentAccess.js';
import { expectedFingerprint } from '../../src/client/expectedFingerprint.js';
import { WeightdClient } from '../../src/client/weightdClient.js';
import { socketPathFor } from '../../src/wire/socketDir.js';
import { encodeFrame, FRAME_HEADER_BYTES, MAX_RESPONSE_BYTES } from '../../src/wire/frameCodec.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { KEEPER_SOCKET_NAME } from '../../src/keeper/keeperSocketPath.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import type { StateReply } from '../../src/wire/protocol.js';
import { faultyRankWorker, type RankFault } from '../actors/fixtures/faultyRankWorker.js';
import { writeArchCheckpoint } from '../helpers/checkpoints.js';
import { startDaemon } from '../helpers/daemon.js';
import { expectedBytes } from '../helpers/expectedBytes.js';
import { writePartially } from '../helpers/partialWriter.js';
import { exampleModel, freshSocketDir } from '../helpers/paths.js';

const MiB = 1 << 20;

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

interface Fixture {
  dir: string;
  paths: string[];
  data: Buffer[];
  ops: CopyOp[];
  segments: number[];
}

/** Unaligned offsets and sizes, a read to the end of a file, small and oversized strided rows. */
function makeFixture(): Fixture {
  // On disk, not tmpfs, so that O_DIRECT is really used where the file system allows it.
  const parent = join(process.cwd(), 'test', 'artifacts');
  mkdirSync(parent, { recursive: true });
  const dir = mkdtempSync(join(parent, 'cuda-'));
  const data = [randomBytes(9_437_201), randomBytes(3_000_003)];
  const paths = data.map((d, i) => {
    const p = join(dir, `f${i}.bin`);
    writeFileSync(p, d);
    return p;
  });
  const c = (file: number, segment: number, srcOffset: number, dstOffset: number, bytes: number): CopyOp =>
    ({ file, segment, srcOffset, dstOffset, rows: 1, rowBytes: bytes, srcPitch: 0 });
  const s = (file: number, segment: number, srcOffset: number, dstOffset: number, rows: number, rowBytes: number, srcPitch: number): CopyOp =>
    ({ file, segment, srcOffset, dstOffset, rows, rowBytes, srcPitch });
  const ops = [
    c(0, 0, 13, 0, 5_000_000),
    c(0, 0, data[0]!.length - 777_777, 5_000_192, 777_777),
    s(1, 1, 3, 0, 1000, 1000, 3000),
    s(0, 1, 100, 1_000_192, 2, 2_500_000, 4_000_000),
    s(1, 0, 1029, 5_777_969, 500, 1024, 2048),
    c(1, 0, 2_999_999, 6_400_000, 1),
  ];
  return { dir, paths, data, ops, segments: [12 * MiB, 6 * MiB] };
}

/** 'no error', or the error's name, code and message: what the error scenarios report. */
/**
 * A served cuda rank as the update desk sees it (src/serve/updateDesk.ts): model "m" on GPU 0,
 * one U8 tensor `t<i>` filling each of `served`'s segments (`segments` bytes each); `info` hears
 * its log's info lines.
 */
function deskRank(served: SegmentExport[], segments: number[], info: (fields: Record<string, unknown>, msg: string) => unknown = () => {}, digestOn?: 'gpu' | 'cpu'): RankService {
  const rank = {
    ...(digestOn ? { digestOn } : {}),
    name: 'm',
    backend: 'cuda',
    device: { index: 0 },
    nnodes: 1,
    globalRank: 0,
    localRank: 0,
    fingerprint: 'f'.repeat(64),
    fingerprintFields: {},
    segments: served,
    tensors: segments.map((bytes, segment) => ({ name: `t${segment}`, dtype: 'U8', shape: [bytes], segment, offset: 0, bytes })),
  };
  const log = { info, warn() {}, debug() {}, error() {} };
  return { rank, log, refuseUnlessServing() {}, holdSegmentFds: () => () => {} } as unknown as RankService;
}

async function outcome(fn: () => unknown): Promise<string> {
  try {
    await fn();
    return 'no error';
  } catch (err) {
    const e = err as Error & { code?: string };
    return `${e.name} ${e.code ?? ''}: ${e.message}`;
  }
}

function payload(ops: CopyOp[]): number {
  return ops.reduce((n, op) => n + op.rows * op.rowBytes, 0);
}

/** Every op's bytes on the device equal the file's, op by op; names the first that differs. */
async function check(device: DeviceHandle, { data, ops }: { data: Buffer[]; ops: CopyOp[] }): Promise<void> {
  for (const [i, op] of ops.entries()) {
    const want = expectedBytes(data[op.file]!, op);
    const got = await device.read(op.segment, op.dstOffset, want.length);
    if (!got.equals(want)) {
      let at = 0;
      while (got[at] === want[at]) at++;
      throw new Error(`op ${i} (${JSON.stringify(op)}) differs at byte ${at}`);
    }
  }
}

interface Member {
  paths: string[];
  /** The contents of `paths`, in the same order. */
  data: Buffer[];
  ops: CopyOp[];
}

/**
 * Two tensor-parallel-like ranks over the fixture's files: GPU 1 lists the files the other way
 * round. Each gets a replicated tensor, its half of a column split, its interleaved half of a
 * row split (strided), and GPU 0 alone a strided op with rows longer than a window.
 */
function groupMembers(fx: Fixture): Member[] {
  const op = (file: number, segment: number, srcOffset: number, dstOffset: number, rows: number, rowBytes: number, srcPitch = 0): CopyOp =>
    ({ file, segment, srcOffset, dstOffset, rows, rowBytes, srcPitch });
  const rank = (k: number): CopyOp[] => [
    op(0, 0, 13, 0, 1, 5_000_000),
    op(0, 1, 5_000_013 + k * 2_000_000, 0, 1, 2_000_000),
    op(1, 0, 3 + k * 500, 5_000_192, 1000, 500, 1000),
    op(1, 1, 1_000_003 + k * 1024, 2_000_192, 900, 1024, 2048),
    ...(k === 0 ? [op(0, 1, 100, 3_000_192, 2, 1_500_000, 4_000_000)] : []),
    op(1, 0, fx.data[1]!.length - 1, 5_600_000, 1, 1),
  ];
  const m0 = { paths: fx.paths, data: fx.data, ops: rank(0) };
  const swap = (f: number) => 1 - f;
  const m1 = { paths: [fx.paths[1]!, fx.paths[0]!], data: [fx.data[1]!, fx.data[0]!], ops: rank(1).map((o) => ({ ...o, file: swap(o.file) })) };
  return [m0, m1];
}

/**
 * A Llama checkpoint whose vocab (32016) the vllm layout pads to 32064: at tp=2, rank 1 holds
 * 15984 real rows and 48 zero rows of the embedding and of lm_head.
 */
async function paddedCheckpoint(): Promise<string> {
  const parent = join(process.cwd(), 'test', 'artifacts');
  mkdirSync(parent, { recursive: true });
  const dir = mkdtempSync(join(parent, 'cuda-padded-'));
  await writeArchCheckpoint(dir, 'LlamaForCausalLM', { hidden: 16, heads: 4, kvHeads: 2, headDim: 4, intermediate: 32, layers: 1, vocab: 32016 });
  return dir;
}

/** Names the first zero range that does not read back as zeros. */
async function checkZeros(device: DeviceHandle, ranges: readonly ZeroRange[]): Promise<void> {
  for (const [i, z] of ranges.entries()) {
    const at = (await device.read(z.segment, z.offset, z.bytes)).findIndex((b) => b !== 0);
    if (at >= 0) throw new Error(`zero range ${i} (${JSON.stringify(z)}) holds a non-zero byte at ${at}`);
  }
}

/** The daemon at tp=2 on the fake GPUs, serving the padded vllm layout: its outcome and message. */
async function serveDaemon(model: string): Promise<{ state: string; message?: string }> {
  const node = await startNode({ model, tensorParallelSize: 2, device: 'cuda', layouts: ['vllm'], socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
  try {
    await node.ready;
  } catch {
    const result = await node.done;
    return { state: result.state, message: result.failure?.message };
  }
  const serving = node.status().ranks.map((r) => r.state).join(',');
  await node.stop('test');
  return { state: serving };
}

const scenarios: Record<string, (args: string[]) => Promise<unknown>> = {
  async probe() {
    const probe = await cudaProbe();
    return { probe, slots: cudaDevices(probe) };
  },

  /** Every mode, with and without O_DIRECT, with small buffers (many reuses) and the defaults. */
  async fill() {
    const fx = makeFixture();
    try {
      const device = new DeviceHandle('cuda', 1, { uuid: cudaDevices(await cudaProbe())[1]!.uuid });
      await device.allocate(fx.segments);
      const runs = [];
      const small = { threads: 3, chunkBytes: MiB, stagingBytes: 4 * MiB };
      for (const options of [
        { ...small, mode: 'pread' as const },
        { ...small, mode: 'pread' as const, direct: true },
        { ...small, mode: 'register' as const },
        { ...small, mode: 'register' as const, direct: true },
        { threads: 1, chunkBytes: MiB, stagingBytes: MiB, mode: 'pread' as const, direct: true },
        {},
      ]) {
        let last = 0;
        const r = await device.fill(fx.paths, fx.ops, payload(fx.ops), options, (p) => {
          if (p.bytes < last) throw new Error('progress went backwards');
          last = p.bytes;
        });
        if (r.bytes !== payload(fx.ops)) throw new Error(`fill reported ${r.bytes} bytes, expected ${payload(fx.ops)}`);
        await check(device, fx);
        runs.push(options);
      }
      await device.free();
      return { runs: runs.length };
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  /**
   * Strided ops whose gaps are worth skipping read only their rows (native/read_ranges.h), on
   * their own and in a group whose members' rows together make contiguous runs; buffered and
   * O_DIRECT, small windows (rows cut at window edges) and the defaults. Reports, per fill, the
   * bytes this process read (rchar: the fill's reader threads are its only readers meanwhile).
   */
  async sparseReads() {
    const parent = join(process.cwd(), 'test', 'artifacts');
    mkdirSync(parent, { recursive: true });
    const dir = mkdtempSync(join(parent, 'cuda-sparse-'));
    const rchar = (): number => Number(/rchar: (\d+)/.exec(readFileSync('/proc/self/io', 'utf8'))![1]);
    try {
      // Not a multiple of 4096 long: an O_DIRECT read of the last block comes back short.
      const data = [randomBytes(8_000_001)];
      const paths = [join(dir, 'f0.bin')];
      writeFileSync(paths[0]!, data[0]!);
      const s = (srcOffset: number, dstOffset: number, rows: number, rowBytes: number, srcPitch: number): CopyOp =>
        ({ file: 0, segment: 0, srcOffset, dstOffset, rows, rowBytes, srcPitch });
      const single = [
        // A down_proj slice at tp=8 (3584 of every 28672 bytes) at an odd offset: its rows straddle blocks.
        s(777 + 5 * 3584, 0, 200, 3584, 28672),
        // A gap of exactly 4096 bytes (skipped) after 512-byte rows.
        s(6_000_123, 1_000_192, 300, 512, 4608),
        // Rows ending exactly at the end of the file.
        s(data[0]!.length - 9 * 10_000 - 2000, 1_200_000, 10, 2000, 10_000),
        // A contiguous range between the others.
        { file: 0, segment: 0, srcOffset: 5_800_000, dstOffset: 1_300_000, rows: 1, rowBytes: 100_000, srcPitch: 0 },
      ];
      const segments = [2 * MiB];
      const runs: Array<{ options: object; group: boolean; read: number; payload: number }> = [];
      const small = { threads: 3, chunkBytes: MiB, stagingBytes: 4 * MiB };
      const optionSets = [{ ...small, mode: 'pread' as const }, { ...small, mode: 'pread' as const, direct: true }, { threads: 1, chunkBytes: MiB, stagingBytes: MiB, direct: true }, {}];
      const [d0, d1] = [0, 1].map((i) => new DeviceHandle('cuda', i));
      await d0!.allocate(segments);
      await d1!.allocate(segments);
      for (const options of optionSets) {
        const before = rchar();
        await d0!.fill(paths, single, 0, options);
        runs.push({ options, group: false, read: rchar() - before, payload: payload(single) });
        await check(d0!, { data, ops: single });
      }
      // Two ranks' 1 KiB of every 16 KiB row, side by side: 2 KiB runs, read once for both.
      const rank = (k: number): CopyOp[] => [s(1_000_005 + k * 1024, 0, 300, 1024, 16_384)];
      for (const options of optionSets) {
        const group = { id: `sparse-${runs.length}`, size: 2 };
        const before = rchar();
        await Promise.all([d0!, d1!].map((d, k) => d.fill(paths, rank(k), 0, { ...options, group })));
        runs.push({ options, group: true, read: rchar() - before, payload: 2 * payload(rank(0)) });
        await check(d0!, { data, ops: rank(0) });
        await check(d1!, { data, ops: rank(1) });
      }
      await d0!.free();
      await d1!.free();
      return { runs };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },

  /**
   * O_DIRECT windows hold as many bytes as buffered ones (native/cuda_copy_engine.cpp): two
   * tensors back to back at an offset 13 bytes past a block boundary, as a checkpoint's tensors
   * lie (its data starts at 8 + the header's length), filled alone with and without O_DIRECT, in
   * 1 MiB and 8 MiB windows (the cold load's). Reports each fill's copies (one per tensor a window
   * holds, from the fake's FAKE_CUDA_COPY_LOG, largest first) and the bytes it read again for the
   * digests; the bytes and digests are checked against the file.
   */
  async directWindows() {
    const log = process.env.FAKE_CUDA_COPY_LOG!;
    const parent = join(process.cwd(), 'test', 'artifacts');
    mkdirSync(parent, { recursive: true });
    const dir = mkdtempSync(join(parent, 'cuda-direct-'));
    try {
      const a = { start: 3 * 4096 + 13, bytes: 20 * MiB + 77 };
      const b = { start: a.start + a.bytes, bytes: 5 * MiB + 3 };
      const data = [randomBytes(b.start + b.bytes + 100)];
      const paths = [join(dir, 'f0.bin')];
      writeFileSync(paths[0]!, data[0]!);
      const ops: CopyOp[] = [a, b].map((t, i) => ({ file: 0, segment: 0, srcOffset: t.start, dstOffset: i * a.bytes, rows: 1, rowBytes: t.bytes, srcPitch: 0 }));
      const tensorRanges = [a, b].map((t) => ({ file: 0, start: t.start, end: t.start + t.bytes }));
      const want = await addon().digestFiles(paths, packTensorRanges(tensorRanges), 2);
      const device = new DeviceHandle('cuda', 0);
      await device.allocate([a.bytes + b.bytes]);
      const runs: Array<{ chunkBytes: number; direct: boolean; copies: number[]; reread: number }> = [];
      for (const chunkBytes of [MiB, 8 * MiB]) {
        for (const direct of [false, true]) {
          writeFileSync(log, '');
          const r = await device.fill(paths, ops, payload(ops), { threads: 2, chunkBytes, stagingBytes: 4 * chunkBytes, mode: 'pread', direct, tensorRanges });
          await check(device, { data, ops });
          if (JSON.stringify(r.digests) !== JSON.stringify(want)) throw new Error(`digests differ from the file's with ${JSON.stringify({ chunkBytes, direct })}`);
          const copies = readFileSync(log, 'utf8').trim().split('\n').map(Number).sort((x, y) => y - x);
          runs.push({ chunkBytes, direct, copies, reread: r.digestRereadBytes });
        }
      }
      await device.free();
      return { runs };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },

  async errors() {
    const fx = makeFixture();
    const codes: Record<string, string> = {};
    const capture = async (name: string, fn: () => unknown) => (codes[name] = await outcome(fn));
    try {
      await capture('index', () => new DeviceHandle('cuda', 7));
      await capture('uuid', () => new DeviceHandle('cuda', 0, { uuid: 'GPU-not-this-one' }));
      const device = new DeviceHandle('cuda', 0);
      await capture('fillBeforeAllocate', () => device.fill(fx.paths, fx.ops, 0, {}));
      await capture('tooBig', () => device.allocate([800 * MiB, 800 * MiB]));
      const before = device.info().freeBytes;
      await device.allocate(fx.segments);
      codes.freeDrop = String(before - device.info().freeBytes);
      await capture('twice', () => device.allocate([MiB]));
      await capture('badMode', () => device.fill(fx.paths, fx.ops, 0, { mode: 'mmap' as never }));
      await capture('pastEnd', () => device.fill(fx.paths, [{ ...fx.ops[0]!, srcOffset: fx.data[0]!.length - 10 }], 0, {}));
      await capture('missingFile', () => device.fill([join(fx.dir, 'nope')], fx.ops, 0, {}));
      await capture('outOfRange', () => device.read(1, 6 * MiB - 10, 11));
      // A cancelled (or already finished) fill leaves the device usable.
      const filling = device.fill(fx.paths, fx.ops, 0, { chunkBytes: MiB, stagingBytes: 2 * MiB, threads: 1 });
      device.cancelFill();
      await capture('cancel', () => filling);
      await device.fill(fx.paths, fx.ops, 0, {});
      await check(device, fx);
      await device.free();
      await device.free();
      return codes;
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  /**
   * Two GPUs filled as one group (one pass over the files): replicated, column-split and
   * row-split (interleaved strided) ops, a row longer than a window, the members' file lists in
   * different orders; every mode, small windows (rows cut at window edges) and the defaults.
   */
  /**
   * Full-content digests through the copy engine: a tp=2 checkpoint filled by two GPUs as one
   * group (every byte passes some window) and by one GPU alone (half of each sharded tensor is
   * read again at the end), in every read mode: each fill reports every tensor's digest, equal to
   * what digestFiles reads from disk (itself held to Python's xxhash by the vectors). Where the
   * pieces were hashed is reported per fill: on the GPU (with FAKE_CUDA_KERNELS and a kernel file,
   * the fake runs the digest kernel), else on the CPU with the reason; digestOn 'cpu' asks for the
   * CPU, and a digestOn of neither is refused.
   */
  async digests() {
    const dir = mkdtempSync(join(process.cwd(), 'test', 'artifacts', 'digests-'));
    try {
      await writeArchCheckpoint(dir, 'LlamaForCausalLM', { hidden: 512, heads: 8, kvHeads: 4, intermediate: 1536, vocab: 4096, layers: 2 });
      const plan = await planCheckpoint(dir, { tpSize: 2 });
      const want = await diskDigests(plan);
      const [d0, d1] = [0, 1].map((i) => new DeviceHandle('cuda', i));
      await d0!.allocate(plan.ranks[0]!.segments);
      await d1!.allocate(plan.ranks[1]!.segments);
      const fill = (d: DeviceHandle, r: number, options: object) =>
        d.fill(plan.ranks[r]!.files, plan.ranks[r]!.ops, plan.ranks[r]!.totalBytes, { ...options, zeroRanges: plan.ranks[r]!.zeroRanges, tensorRanges: plan.ranks[r]!.contentTensors.ranges });
      const small = { threads: 3, chunkBytes: MiB, stagingBytes: 4 * MiB };
      const runs: string[] = [];
      const rereads: { options: string; group: number[]; alone: number }[] = [];
      const hashing: { options: string; group: number[]; alone: number; unavailable?: string; timed?: (number | undefined)[][] }[] = [];
      for (const options of [{ ...small, mode: 'pread' as const }, { ...small, mode: 'pread' as const, direct: true }, { ...small, mode: 'register' as const }, {}]) {
        const group = { id: `digests-${runs.length}`, size: 2 };
        const both = await Promise.all([d0!, d1!].map((d, r) => fill(d, r, { ...options, group })));
        const alone = await fill(d0!, 0, options);
        for (const [what, got] of [['group GPU 0', both[0]!.digests], ['group GPU 1', both[1]!.digests], ['alone', alone.digests]] as const) {
          if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`${what} with ${JSON.stringify(options)}: digests differ from the files'`);
        }
        rereads.push({ options: JSON.stringify(options), group: both.map((f) => f.digestRereadBytes), alone: alone.digestRereadBytes });
        hashing.push({
          options: JSON.stringify(options), group: both.map((f) => f.digestGpuBytes), alone: alone.digestGpuBytes, unavailable: alone.digestGpuUnavailable,
          timed: [...both, alone].map((f) => [f.digestGpuSetupSeconds, f.digestGpuTailSeconds]),
        });
        runs.push(JSON.stringify(options));
      }
      const asked = await fill(d0!, 0, { digestOn: 'cpu' });
      if (JSON.stringify(asked.digests) !== JSON.stringify(want)) throw new Error("digestOn: 'cpu': digests differ from the files'");
      hashing.push({ options: "{digestOn:'cpu'}", group: [], alone: asked.digestGpuBytes, unavailable: asked.digestGpuUnavailable });
      let refused = '';
      await fill(d0!, 0, { digestOn: 'tpu' as 'cpu' }).catch((err: Error) => (refused = err.message));
      await d0!.free();
      await d1!.free();
      return { runs: runs.length, tensors: want.length, rereads, hashing, refused };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },

  /**
   * The digest kernels are loaded once per CUDA context (native/cuda_digest_kernels.h): the
   * warm-up loads them ahead, and the fills after it load none; once the context ended (every
   * reference to it released), a fill in the context made again loads its own, and still hashes
   * on the GPU (a kernel of the ended context would be refused). Run with the digest kernel
   * loadable and FAKE_CUDA_MODULE_LOG.
   */
  async digestKernelsKept() {
    const dir = mkdtempSync(join(process.cwd(), 'test', 'artifacts', 'kernels-'));
    const loads = () => {
      try {
        return readFileSync(process.env.FAKE_CUDA_MODULE_LOG!, 'utf8').split('\n').filter(Boolean);
      } catch {
        return [];
      }
    };
    try {
      await writeArchCheckpoint(dir, 'LlamaForCausalLM', { hidden: 256, heads: 4, kvHeads: 2, intermediate: 512, vocab: 1024, layers: 1 });
      const plan = await planCheckpoint(dir, { tpSize: 1 });
      const want = await diskDigests(plan);
      const rank = plan.ranks[0]!;
      const twoFills = async () => {
        const device = new DeviceHandle('cuda', 0);
        await device.allocate(rank.segments);
        const fills = [];
        for (let i = 0; i < 2; i++) fills.push(await device.fill(rank.files, rank.ops, rank.totalBytes, { zeroRanges: rank.zeroRanges, tensorRanges: rank.contentTensors.ranges }));
        await device.free();
        return fills;
      };
      await addon().warmCuda(1, 0);
      const afterWarm = loads();
      const warm = await twoFills();
      const afterFills = loads();
      // The warm-up's reference goes, and the device's went with its free: the context ends.
      addon().endCudaWarmup();
      const again = await twoFills();
      const fills = [...warm, ...again];
      return {
        loads: { afterWarm, afterFills, afterAgain: loads() },
        onGpu: fills.map((f) => f.digestGpuBytes > 0 && f.digestGpuUnavailable === undefined),
        digestsEqual: fills.every((f) => JSON.stringify(f.digests) === JSON.stringify(want)),
      };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },

  async group() {
    const fx = makeFixture();
    try {
      const [d0, d1] = [0, 1].map((i) => new DeviceHandle('cuda', i));
      const members = groupMembers(fx);
      await d0!.allocate(fx.segments);
      await d1!.allocate(fx.segments);
      const small = { threads: 3, chunkBytes: MiB, stagingBytes: 4 * MiB };
      const runs = [];
      for (const options of [
        { ...small, mode: 'pread' as const },
        { ...small, mode: 'pread' as const, direct: true },
        { ...small, mode: 'register' as const },
        { threads: 1, chunkBytes: MiB, stagingBytes: MiB },
        {},
      ]) {
        const group = { id: `group-${runs.length}`, size: 2 };
        const results = await Promise.all([d0!, d1!].map((d, i) => d.fill(members[i]!.paths, members[i]!.ops, 0, { ...options, group })));
        results.forEach((r, i) => {
          if (r.bytes !== payload(members[i]!.ops)) throw new Error(`GPU ${i} reported ${r.bytes} bytes, expected ${payload(members[i]!.ops)}`);
        });
        await check(d0!, members[0]!);
        await check(d1!, members[1]!);
        runs.push(options);
      }
      await d0!.free();
      await d1!.free();
      return { runs: runs.length };
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  /** A group's failures: sizes that disagree, a member cancelled while waiting, a bad op in one. */
  async groupErrors() {
    const fx = makeFixture();
    const codes: Record<string, string> = {};
    const capture = async (name: string, fill: Promise<unknown>) => (codes[name] = await outcome(() => fill));
    try {
      const [d0, d1] = [0, 1].map((i) => new DeviceHandle('cuda', i));
      const members = groupMembers(fx);
      await d0!.allocate(fx.segments);
      await d1!.allocate(fx.segments);
      const fill = (d: DeviceHandle, i: number, group: { id: string; size: number }, ops = members[i]!.ops, onProgress?: (p: FillProgress) => void) =>
        d.fill(members[i]!.paths, ops, 0, { group }, onProgress);
      // GPU 0 must have joined (and so sized the group) before GPU 1 arrives: its fill runs on a
      // thread of its own, so wait for it to say so.
      let joined!: () => void;
      const hasJoined = new Promise<void>((resolve) => (joined = resolve));
      const waiting = fill(d0!, 0, { id: 'sizes', size: 2 }, undefined, (p) => p.waitingForGroup && joined());
      const cancelWhileWaiting = capture('cancelWhileWaiting', waiting); // a failure before the join is reported, not unhandled
      await Promise.race([hasJoined, cancelWhileWaiting]);
      await capture('sizes', fill(d1!, 1, { id: 'sizes', size: 3 }));
      d0!.cancelFill();
      await cancelWhileWaiting;
      await capture('lateMember', fill(d1!, 1, { id: 'sizes', size: 2 }));
      // Both members have been told: the abandoned id is forgotten, and a new group may take it.
      await capture('reused', Promise.all([fill(d0!, 0, { id: 'sizes', size: 2 }), fill(d1!, 1, { id: 'sizes', size: 2 })]));
      // Groups whose second member never comes are remembered for late arrivals, but not for ever.
      for (let i = 0; i <= 16; i++) {
        const waiting = fill(d0!, 0, { id: `lonely-${i}`, size: 2 });
        d0!.cancelFill();
        await outcome(() => waiting);
      }
      await capture('lonelyRecent', fill(d1!, 1, { id: 'lonely-16', size: 2 }));
      await capture('lonelyOldest', Promise.all([fill(d0!, 0, { id: 'lonely-0', size: 2 }), fill(d1!, 1, { id: 'lonely-0', size: 2 })]));
      // GPU 1 lists fixture file 0 second: its op 0 reads that file.
      const pastEnd = [...members[1]!.ops, { ...members[1]!.ops[0]!, srcOffset: fx.data[0]!.length - 10 }];
      await Promise.all([
        capture('badOpOther', fill(d0!, 0, { id: 'bad', size: 2 })),
        capture('badOpOwn', fill(d1!, 1, { id: 'bad', size: 2 }, pastEnd)),
      ]);
      // Both devices still fill correctly afterwards.
      await Promise.all([fill(d0!, 0, { id: 'after', size: 2 }), fill(d1!, 1, { id: 'after', size: 2 })]);
      await check(d0!, members[0]!);
      await check(d1!, members[1]!);
      // A member that will not fill (it adopted) leaves: the other fills alone, into fresh memory
      // here, whether the leave comes before it joins or while it waits.
      await d0!.free();
      await d1!.free();
      await d0!.allocate(fx.segments);
      await d1!.allocate(fx.segments);
      addon().leaveFillGroup('cuda', 'left-first', 2);
      codes.leftFirst = await outcome(() => fill(d0!, 0, { id: 'left-first', size: 2 }));
      await check(d0!, members[0]!);
      let waits!: () => void;
      const isWaiting = new Promise<void>((resolve) => (waits = resolve));
      const waitingAlone = fill(d1!, 1, { id: 'left-later', size: 2 }, undefined, (p) => p.waitingForGroup && waits());
      await Promise.race([isWaiting, waitingAlone]);
      addon().leaveFillGroup('cuda', 'left-later', 2);
      codes.leftLater = await outcome(() => waitingAlone);
      await check(d1!, members[1]!);
      await d0!.free();
      await d1!.free();
      return codes;
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  /**
   * The daemon itself at tp=2 on two (fake) GPUs, whose ranks fill as one group: it becomes
   * ready and stops cleanly; and when rank 1 fails before or while joining its fill, rank 0 (which
   * may be waiting for it in the group) is torn down with it, promptly.
   */
  async daemonGroup() {
    const start = (fault?: RankFault) =>
      startNode(
        { model: exampleModel, tensorParallelSize: 2, device: 'cuda', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) },
        { rankWorker: fault && faultyRankWorker(fault) },
      );
    const node = await start();
    await node.ready;
    const loaded = node.status().ranks.map((r) => ({ state: r.state, bytes: r.bytes, totalBytes: r.totalBytes }));
    const stopped = (await node.stop('test')).state;
    const faults: Record<string, { state: string; message?: string; ms: number }> = {};
    for (const [phase, kind] of [['allocate', 'throw'], ['fill', 'throw'], ['fill', 'device'], ['fill', 'exit']] as const) {
      const t0 = performance.now();
      const failing = await start({ localRank: 1, phase, kind });
      const result = await failing.done;
      faults[`${phase}-${kind}`] = { state: result.state, message: result.failure?.message, ms: Math.round(performance.now() - t0) };
    }
    return { loaded, stopped, faults };
  },

  /** Run with FAKE_CUDA_FAULT_DEVICE=1: an asynchronous copy fault names the GPU it happened on, alone and in a group. */
  async asyncFault() {
    const fx = makeFixture();
    const codes: Record<string, string> = {};
    try {
      const [d0, d1] = [0, 1].map((i) => new DeviceHandle('cuda', i));
      const members = groupMembers(fx);
      await d0!.allocate(fx.segments);
      await d1!.allocate(fx.segments);
      const group = { id: 'fault', size: 2 };
      await Promise.all([
        outcome(() => d0!.fill(members[0]!.paths, members[0]!.ops, 0, { group })).then((o) => (codes.groupOther = o)),
        outcome(() => d1!.fill(members[1]!.paths, members[1]!.ops, 0, { group })).then((o) => (codes.groupOwn = o)),
      ]);
      codes.alone = await outcome(() => d1!.fill(members[1]!.paths, members[1]!.ops, 0, {}));
      codes.healthy = await outcome(() => d0!.fill(members[0]!.paths, members[0]!.ops, 0, {}));
      await d0!.free();
      await d1!.free();
      return codes;
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  /**
   * A padded vllm plan at tp=2, each rank on its own fake GPU (whose memory starts non-zero):
   * the zero ranges read back as zeros and every op's bytes equal the checkpoint's; zeroing
   * writes exactly the ranges (an unaligned one too); bad ranges are refused; the daemon serves it.
   */
  async padding() {
    const dir = await paddedCheckpoint();
    try {
      const plan = await planCheckpoint(dir, { tpSize: 2, layouts: ['vllm'] });
      const zeroBytes: number[] = [];
      for (const rank of plan.ranks) {
        const device = new DeviceHandle('cuda', rank.tpRank);
        await device.allocate(rank.segments);
        await device.fill(rank.files, rank.ops, rank.totalBytes, { zeroRanges: rank.zeroRanges });
        await checkZeros(device, rank.zeroRanges);
        await check(device, { data: rank.files.map((f) => readFileSync(f)), ops: rank.ops });
        zeroBytes.push(rank.zeroRanges.reduce((n, z) => n + z.bytes, 0));
        await device.free();
      }
      // Only the ranges are written: the bytes around them keep the fake's 0xEE.
      const device = new DeviceHandle('cuda', 0);
      await device.allocate([MiB]);
      const ranges = [{ segment: 0, offset: 3, bytes: 5 }, { segment: 0, offset: 4096, bytes: 4096 }];
      await device.fill([], [], 0, { zeroRanges: ranges });
      await checkZeros(device, ranges);
      const around = [...(await device.read(0, 0, 3)), ...(await device.read(0, 8, 4088)), ...(await device.read(0, 8192, 4096))];
      const untouched = around.every((b) => b === 0xee);
      const outside = await outcome(() => device.fill([], [], 0, { zeroRanges: [{ segment: 0, offset: MiB - 1, bytes: 2 }] }));
      const segment = await outcome(() => device.fill([], [], 0, { zeroRanges: [{ segment: 2 ** 32, offset: 0, bytes: 1 }] }));
      await device.free();
      return { zeroBytes, untouched, outside, segment, daemon: await serveDaemon(dir) };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },

  /** Run with FAKE_CUDA_FAIL_MEMSET=1: zeroing fails by name, alone and in the daemon's ranks. */
  async paddingMemsetFails() {
    const dir = await paddedCheckpoint();
    try {
      const plan = await planCheckpoint(dir, { tpSize: 2, layouts: ['vllm'] });
      const rank = plan.ranks[1]!;
      const device = new DeviceHandle('cuda', 1);
      await device.allocate(rank.segments);
      const alone = await outcome(() => device.fill(rank.files, rank.ops, rank.totalBytes, { zeroRanges: rank.zeroRanges }));
      // The device stays usable: a fill without padding still lands.
      await device.fill(rank.files, rank.ops, rank.totalBytes, {});
      await check(device, { data: rank.files.map((f) => readFileSync(f)), ops: rank.ops });
      await device.free();
      return { alone, daemon: await serveDaemon(dir) };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },

  /**
   * Run with FAKE_CUDA_INIT_GATE and FAKE_CUDA_DTOH_GATE (FIFOs the fake's cuInit and
   * cuMemcpyDtoH wait on): the probe and reads held in the driver leave the JS thread free to
   * open the gates; a free() asked for during a read waits for it; the raw device refuses
   * every other call while a read runs, and keeps the read's buffer alive through a collection.
   */
  async inFlight() {
    // Returns once the native side has opened the FIFO: a call that blocked the JS thread would
    // never let this line run.
    const openGate = (name: string) => writeFileSync(process.env[name]!, 'x');
    const probing = cudaProbe();
    openGate('FAKE_CUDA_INIT_GATE');
    const probe = await probing;

    const device = new DeviceHandle('cuda', 0);
    await device.allocate([MiB]);
    await device.fill([], [], 0, { zeroRanges: [{ segment: 0, offset: 0, bytes: MiB }] });
    const settled: string[] = [];
    const reading = device.read(0, 0, MiB).then((b) => (settled.push('read'), b));
    const freeing = device.free().then(() => settled.push('freed'));
    await new Promise(setImmediate); // the handle calls the addon from a microtask: all have run by now
    openGate('FAKE_CUDA_DTOH_GATE');
    const bytes = await reading;
    await freeing;
    const readAfterFree = await outcome(() => device.read(0, 0, 1));

    const raw = new (addon().Device)('cuda', 1, {});
    await raw.allocate([MiB]);
    const rawRead = raw.read(0, 0, new Uint8Array(MiB)); // the job's pin is the buffer's only reference
    gc();
    const busy = { free: await outcome(() => raw.free()), info: await outcome(() => raw.info()), read: await outcome(() => raw.read(0, 0, new Uint8Array(1))) };
    openGate('FAKE_CUDA_DTOH_GATE');
    await rawRead;
    await raw.free();
    return { available: probe.available, zeros: bytes.every((b) => b === 0), settled, readAfterFree, busy };
  },

  /** Exports, then has another process open the handles and compare bytes. */
  async ipc() {
    const fx = makeFixture();
    try {
      const device = new DeviceHandle('cuda', 0);
      await device.allocate(fx.segments);
      await device.fill(fx.paths, fx.ops, 0, {});
      const exported = device.exportSegments();
      let sameProcess = 'opened';
      try {
        CudaIpcSegment.open(0, exported[0]!.handle);
      } catch (err) {
        sameProcess = (err as { code: string }).code;
      }
      const op = fx.ops[4]!;
      const want = expectedBytes(fx.data[op.file]!, op);
      const self = fileURLToPath(import.meta.url);
      const wantPath = join(fx.dir, 'want.bin');
      writeFileSync(wantPath, want);
      const child = spawnSync(process.execPath, [self, 'ipcClient', exported[0]!.handle, String(op.dstOffset), wantPath], {
        encoding: 'utf8',
      });
      await device.free();
      if (child.status !== 0) throw new Error(`client failed (${child.status ?? child.signal ?? child.error}): ${child.stderr}`);
      return { sameProcess, client: JSON.parse(child.stdout.trim().split('\n').pop()!) };
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  /**
   * Run with FAKE_CUDA_MEM_MB=3072: a 2.25 GiB segment (over the addon's old 2 GiB cap, like
   * Qwen2.5-72B's 2.49 GB embedding) is copied out whole by another process, through the
   * chunked read; marks at the start, across the 2 GiB line and at the end must arrive.
   */
  async bigCopy() {
    const fx = makeFixture();
    try {
      const bytes = 2 ** 31 + 2 ** 28;
      const marks = [0, 2 ** 31 - 2048, bytes - 4096];
      const ops = marks.map((dstOffset, i): CopyOp => ({ file: 0, segment: 0, srcOffset: i * 4096, dstOffset, rows: 1, rowBytes: 4096, srcPitch: 0 }));
      const device = new DeviceHandle('cuda', 0);
      await device.allocate([bytes]);
      await device.fill(fx.paths, ops, 0, {});
      const wantPath = join(fx.dir, 'want.bin');
      writeFileSync(wantPath, fx.data[0]!.subarray(0, 3 * 4096));
      const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), 'bigCopyClient', device.exportSegments()[0]!.handle, JSON.stringify(marks), wantPath], { encoding: 'utf8' });
      await device.free();
      if (child.status !== 0) throw new Error(`client failed (${child.status ?? child.signal ?? child.error}): ${child.stderr}`);
      return JSON.parse(child.stdout.trim().split('\n').pop()!);
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  async bigCopyClient([handle, marks, wantPath]) {
    const want = readFileSync(wantPath!);
    const seg = CudaIpcSegment.open(0, handle!);
    try {
      const all = new Uint8Array(await seg.read(0, seg.bytes));
      const arrived = (JSON.parse(marks!) as number[]).map((at, i) => Buffer.from(all.buffer, at, 4096).equals(want.subarray(i * 4096, (i + 1) * 4096)));
      return { bytes: all.byteLength, arrived };
    } finally {
      seg.close();
    }
  },

  /**
   * --cuda-handles fd: VMM segments filled, checked and exported as descriptors (the same ones on
   * every export); reopened descriptors adopted by a second device of this process, and the
   * exported ones inherited by a child process that adopts them, both read the fill's bytes.
   */
  async vmm() {
    const fx = makeFixture();
    try {
      const device = new DeviceHandle('cuda', 1, { uuid: cudaDevices(await cudaProbe())[1]!.uuid, cudaHandles: 'fd' });
      const before = device.info().freeBytes;
      await device.allocate(fx.segments);
      const held = before - device.info().freeBytes;
      await device.fill(fx.paths, fx.ops, payload(fx.ops), { threads: 2, chunkBytes: MiB, stagingBytes: 4 * MiB, mode: 'register' });
      await check(device, fx);
      const exported = device.exportSegments();
      const again = device.exportSegments();
      const fds = exported.map((e) => e.fd!);
      // /proc/self/fd/N opens the fake's memfd afresh: a descriptor of its own, as a dup would be.
      const adopter = new DeviceHandle('cuda', 1, { cudaHandles: 'fd' });
      await adopter.adopt(fds.map((fd) => openSync(`/proc/self/fd/${fd}`, 'r+')), fx.segments);
      await check(adopter, fx);
      const adoptedExport = adopter.exportSegments();
      const fillAdopted = await outcome(() => adopter.fill(fx.paths, fx.ops, 0, {}));
      await adopter.free();
      const client = await openAsClient(exported, fds, fx);
      const child = await adoptInChild(fds, fx);
      await device.free();
      return {
        held,
        handles: exported.map((e) => e.handle),
        bytes: exported.map((e) => e.bytes),
        sameFds: JSON.stringify(again.map((e) => e.fd)) === JSON.stringify(fds),
        adoptedHandles: adoptedExport.map((e) => e.handle),
        fillAdopted,
        fdsClosedByFree: fds.map((fd) => outcomeSync(() => fstatSync(fd))),
        client,
        freeAfter: device.info().freeBytes === before,
        child,
      };
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  /**
   * A writer's segments (native/cuda_update_segments.h): a staging copy of a served segment, then
   * the commit's final copy of it beside a shared segment, digested by the kernel (the test sets
   * FAKE_CUDA_KERNELS) or from device memory read back in windows (a tensor of 70 MiB crosses
   * several), against the same bytes digested from files; or the commit's failure, when the test
   * makes one of its driver calls fail.
   */
  async updateSegments() {
    const parent = join(process.cwd(), 'test', 'artifacts');
    mkdirSync(parent, { recursive: true });
    const dir = mkdtempSync(join(parent, 'cuda-update-'));
    try {
      const data = [randomBytes(70 * MiB + 123), randomBytes(3 * MiB)];
      const paths = data.map((d, i) => {
        const p = join(dir, `f${i}.bin`);
        writeFileSync(p, d);
        return p;
      });
      const segments = [72 * MiB, 4 * MiB];
      const ops: CopyOp[] = data.map((d, i) => ({ file: i, segment: i, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: d.length, srcPitch: 0 }));
      const device = new DeviceHandle('cuda', 0, { uuid: cudaDevices(await cudaProbe())[0]!.uuid, cudaHandles: 'fd' });
      await device.allocate(segments);
      await device.fill(paths, ops, payload(ops), { threads: 2, chunkBytes: 4 * MiB, stagingBytes: 8 * MiB });
      const served = device.exportSegments().map((e) => e.fd!);
      const staging = await addon().cudaStagingCopy(0, served[0]!, segments[0]!);
      const shared = addon().dupFd(served[1]!);
      // Tensors that start off a piece boundary and end short of the segment's end.
      const tensors = [
        { file: 0, start: 5, end: data[0]!.length },
        { file: 1, start: 0, end: MiB + 7 },
        { file: 1, start: MiB + 7, end: 3 * MiB },
      ];
      const commit = addon().cudaCommitCopies(0, [staging, shared], [true, false], segments, packTensorRanges(tensors), 3, 'gpu');
      // A commit that fails midway (FAKE_CUDA_VMM_FAIL) gives back what it made, queued copies drained first.
      const failed = await outcome(() => commit);
      if (failed !== 'no error') {
        for (const fd of [staging, shared]) addon().closeFd(fd);
        await device.free();
        return { commitFailed: failed };
      }
      const committed = await commit;
      const fromFiles = await addon().digestFiles(paths, packTensorRanges(tensors), 2);
      // The final copy holds the base's bytes, and a device adopts it as it adopts any export.
      const adopter = new DeviceHandle('cuda', 0, { cudaHandles: 'fd' });
      await adopter.adopt([committed.fds[0]!], [segments[0]!]);
      const finalBytes = (await adopter.read(0, 0, data[0]!.length)).equals(data[0]!);
      await adopter.free();
      for (const fd of [staging, shared]) addon().closeFd(fd);
      await device.free();
      return {
        sharedFd: committed.fds[1],
        digestsEqual: JSON.stringify(committed.digests) === JSON.stringify(fromFiles),
        digests: committed.digests.length,
        onGpu: committed.hashedOn === 'gpu',
        finalBytes,
      };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },

  /**
   * A writer's partial update on cuda, through the update desk and the rank's adoption of the
   * written version (src/serve/updateDesk.ts, src/actors/rankPhases.ts): the segment it shares
   * with its base is, by SegmentExport.memory, the base's memory (so eviction counts it once, as
   * a memfd's inode does on the host), and the segment it wrote is memory of its own.
   */
  async writtenSharesMemory() {
    const segments = [2 * MiB, 2 * MiB];
    const base = new DeviceHandle('cuda', 0, { uuid: cudaDevices(await cudaProbe())[0]!.uuid, cudaHandles: 'fd' });
    await base.allocate(segments);
    const served = base.exportSegments();
    const service = deskRank(served, segments);
    const desk = new UpdateDesk();
    const written = new DeviceHandle('cuda', 0, { cudaHandles: 'fd' });
    let adopted: SegmentExport[] = [];
    desk.publisher = async (version) => {
      const data = { written: version.ranks[0]!, plan: { segments, totalBytes: segments[0]! + segments[1]! } } as unknown as RankWorkerData;
      await rankPhases.adopt(written, data, () => {});
      adopted = written.exportSegments();
      return { version: 1 };
    };
    const caller = { pid: process.pid, connectionId: 1 };
    const begun = await desk.begin(service, 'v0', [0], caller, () => true, ['t0']);
    begun.sent();
    await desk.commit(begun.id, caller);
    const memory = (list: SegmentExport[]) => list.map((s) => s.memory);
    const result = { base: memory(served), written: memory(adopted) };
    await written.free();
    await base.free();
    return {
      sharedIsTheBase: result.written[1] !== undefined && result.written[1] === result.base[1],
      writtenIsItsOwn: result.written[0] !== undefined && !result.base.includes(result.written[0]),
      baseDistinct: result.base[0] !== undefined && result.base[0] !== result.base[1],
    };
  },

  /**
   * Two commits of a writer's update on cuda through the update desk (src/serve/updateDesk.ts),
   * the first on a rank whose fill hashes on the CPU (ServedRankData.digestOn 'cpu'), the second
   * on one that hashes on the GPU with WEIGHTD_FILL_DIGESTS_ON=cpu set, which the desk does not
   * read again: where each commit hashed its digests (its "update sealed" line), and whether the
   * two agree. Run with the digest kernel loadable, so that only digestOn keeps the first off the GPU.
   */
  async updateDigestsOn() {
    const segments = [2 * MiB, 2 * MiB];
    const base = new DeviceHandle('cuda', 0, { uuid: cudaDevices(await cudaProbe())[0]!.uuid, cudaHandles: 'fd' });
    await base.allocate(segments);
    const sealed: unknown[] = [];
    const desk = new UpdateDesk();
    const digests: string[][] = [];
    desk.publisher = async (version) => {
      digests.push(version.ranks[0]!.digests);
      return { version: digests.length };
    };
    const caller = { pid: process.pid, connectionId: 1 };
    for (const [digestOn, variable] of [['cpu', undefined], ['gpu', 'cpu']] as const) {
      if (variable === undefined) delete process.env.WEIGHTD_FILL_DIGESTS_ON;
      else process.env.WEIGHTD_FILL_DIGESTS_ON = variable;
      const service = deskRank(base.exportSegments(), segments, (fields, msg) => msg.startsWith('update sealed') && sealed.push(fields.hashedOn), digestOn);
      const begun = await desk.begin(service, 'v0', [0], caller, () => true, ['t0']);
      begun.sent();
      await desk.commit(begun.id, caller);
    }
    await base.free();
    return { hashedOn: sealed, digests: digests[0]!.length, sameDigests: JSON.stringify(digests[0]) === JSON.stringify(digests[1]) };
  },

  /**
   * A processed layout's commit on cuda (PUBLISH_BACKENDS.cuda, src/serve/publishDesk.ts) on a rank
   * whose fill hashes on the CPU, then on one that hashes on the GPU: where each hashed, and
   * whether their digests agree. Run with the digest kernel loadable.
   */
  async publishDigestsOn() {
    const bytes = 2 * MiB;
    const hashedOn: unknown[] = [];
    const digests: string[][] = [];
    const base = new DeviceHandle('cuda', 0, { uuid: cudaDevices(await cudaProbe())[0]!.uuid, cudaHandles: 'fd' });
    await base.allocate([bytes]);
    for (const digestOn of ['cpu', 'gpu'] as const) {
      const service = deskRank(base.exportSegments(), [bytes], () => {}, digestOn);
      const fd = await PUBLISH_BACKENDS.cuda.create(service, bytes, 'publish');
      const committed = await PUBLISH_BACKENDS.cuda.commit(service, fd, bytes, [{ start: 0, end: MiB }, { start: MiB, end: bytes }]);
      addon().closeFd(committed.fd);
      hashedOn.push(committed.hashedOn);
      digests.push(committed.digests);
    }
    await base.free();
    return { hashedOn, sameDigests: JSON.stringify(digests[0]) === JSON.stringify(digests[1]) };
  },

  /**
   * A node started with `fill: { digestOn: 'cpu' }` in code (no WEIGHTD_FILL_DIGESTS_ON), the
   * digest kernel loadable: where a writer's commit hashed (its "update sealed" line).
   */
  async nodeDigestsOn() {
    const lines: Record<string, unknown>[] = [];
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    delete process.env.WEIGHTD_FILL_DIGESTS_ON;
    const dir = mkdtempSync(join(process.cwd(), 'test', 'artifacts', 'cuda-digests-on-'));
    try {
      const planFile = join(dir, 'plan.json');
      writeFileSync(planFile, JSON.stringify({ rules: [], segmentBytes: MiB }));
      const node = await startNode({ model: exampleModel, planFile, device: 'cuda', cudaHandles: 'fd', socketDir: freshSocketDir(), fill: { digestOn: 'cpu' }, logger });
      try {
        const socket = (await node.ready).ranks[0]!.socketPath!;
        const plan = (await planCheckpoint(exampleModel, { tpSize: 1, planFile })).ranks[0]!;
        await writePartially(socket, 'tiny-llama', plan.tensors.find((t) => t.segment === 1 && t.bytes > 0)!.name, 0);
      } finally {
        await node.stop('test');
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    const said = (prefix: string) => lines.filter((l) => String(l.msg).startsWith(prefix));
    return { sealed: said('update sealed').map((l) => l.hashedOn) };
  },

  /** Child of vmm(): adopts descriptors 3, 4, ... (inherited), checks the bytes, frees. */
  async vmmChild([fixture, opsJson, segmentsJson]) {
    const paths = JSON.parse(fixture!) as string[];
    const fx = { data: paths.map((p) => readFileSync(p)), ops: JSON.parse(opsJson!) as CopyOp[] };
    const segments = JSON.parse(segmentsJson!) as number[];
    const device = new DeviceHandle('cuda', 1, { cudaHandles: 'fd' });
    await device.adopt(segments.map((_, i) => 3 + i), segments);
    await check(device, fx);
    await device.free();
    return { equal: true };
  },

  /**
   * Run with FAKE_CUDA_VMM_FAIL=NAME:N: a VMM call failing midway through an allocation of three
   * segments fails it and gives back everything made so far; the device allocates again after.
   * The export runs either way, so a failing cuMemExportToShareableHandle is tested here too.
   */
  async vmmFailure() {
    const device = new DeviceHandle('cuda', 0, { cudaHandles: 'fd' });
    const before = device.info().freeBytes;
    const failed = await outcome(() => device.allocate([4 * MiB, 3 * MiB, 4 * MiB]));
    const freeAfterFailure = device.info().freeBytes === before;
    if (failed !== 'no error') await device.allocate([4 * MiB, 3 * MiB, 4 * MiB]);
    const exported = await outcome(() => device.exportSegments());
    await device.free();
    return { failed, freeAfterFailure, exported };
  },

  /** adopt's refusals: each closes the descriptors it was given. */
  async vmmAdoptErrors() {
    const fx = makeFixture();
    try {
      const source = new DeviceHandle('cuda', 0, { cudaHandles: 'fd' });
      await source.allocate([4 * MiB]);
      const fd = source.exportSegments()[0]!.fd!;
      const reopen = () => openSync(`/proc/self/fd/${fd}`, 'r+');
      const codes: Record<string, string> = {};
      const closed: Record<string, string> = {};
      const attempt = async (name: string, device: DeviceHandle, fds: number[], sizes: number[]) => {
        codes[name] = await outcome(() => device.adopt(fds, sizes));
        closed[name] = fds.map((f) => outcomeSync(() => fstatSync(f))).join(',');
        await device.free();
      };
      await attempt('notVmm', new DeviceHandle('cuda', 0), [openSync(fx.paths[0]!, 'r')], [MiB]);
      await attempt('tooBig', new DeviceHandle('cuda', 0), [reopen()], [6 * MiB]);
      await attempt('counts', new DeviceHandle('cuda', 0), [reopen(), reopen()], [MiB]);
      await attempt('secondBad', new DeviceHandle('cuda', 0), [reopen(), openSync(fx.paths[0]!, 'r')], [MiB, MiB]);
      const allocated = new DeviceHandle('cuda', 0);
      await allocated.allocate([MiB]);
      await attempt('allocated', allocated, [reopen()], [MiB]);
      await source.free();
      return { codes, closed };
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  /**
   * A device whose context is deferred (deferContext: a restart's fast path) adopting descriptors:
   * contexts made (FAKE_CUDA_RETAIN_LOG) and its info after adopt and export; whether it exports
   * the descriptors it was given; a read (which checks first) and the contexts after; then a
   * second one given a descriptor that is not VMM memory: its checkAdopted's error, and whether
   * the descriptors it holds are still open after the failure and closed by free.
   */
  async vmmDeferred() {
    const fx = makeFixture();
    const retainLog = join(fx.dir, 'retains');
    const contexts = () => readFileSync(retainLog, { encoding: 'utf8', flag: 'a+' }).split('\n').filter(Boolean).length;
    try {
      const source = new DeviceHandle('cuda', 0, { cudaHandles: 'fd' });
      await source.allocate(fx.segments);
      await source.fill(fx.paths, fx.ops, payload(fx.ops), { threads: 2, chunkBytes: MiB, stagingBytes: 4 * MiB });
      const reopen = (fd: number) => openSync(`/proc/self/fd/${fd}`, 'r+');
      const given = source.exportSegments().map((e) => reopen(e.fd!));
      process.env.FAKE_CUDA_RETAIN_LOG = retainLog;
      const deferred = new DeviceHandle('cuda', 0, { cudaHandles: 'fd', deferContext: true });
      await deferred.adopt(given, fx.segments);
      const exported = deferred.exportSegments().map((e) => e.fd);
      const beforeCheck = { contexts: contexts(), freeProbed: deferred.info().freeProbed ?? true, exportsGiven: JSON.stringify(exported) === JSON.stringify(given) };
      await check(deferred, fx);
      const afterRead = { contexts: contexts(), freeProbed: deferred.info().freeProbed ?? true };
      await deferred.free();
      const bad = new DeviceHandle('cuda', 0, { cudaHandles: 'fd', deferContext: true });
      const badFds = [reopen(source.exportSegments()[0]!.fd!), openSync(fx.paths[0]!, 'r')];
      await bad.adopt(badFds, [fx.segments[0]!, MiB]);
      const checkError = await outcome(() => bad.checkAdopted());
      const heldAfterFailure = badFds.map((f) => outcomeSync(() => fstatSync(f))).join(',');
      await bad.free();
      delete process.env.FAKE_CUDA_RETAIN_LOG;
      await source.free();
      return { beforeCheck, afterRead, closedByFree: given.map((f) => outcomeSync(() => fstatSync(f))).join(','), checkError, heldAfterFailure, badClosedByFree: badFds.map((f) => outcomeSync(() => fstatSync(f))).join(',') };
    } finally {
      rmSync(fx.dir, { recursive: true, force: true });
    }
  },

  /**
   * The daemon at tp=2 with cudaHandles 'fd': both GPUs fill VMM memory as one group and serve it
   * as "cuda-fd"; the TypeScript client copies every tensor through get_segment_fds (each equal
   * to the checkpoint's slice) and attaches, holding no descriptor once detached.
   */
  async daemonFd() {
    const socketDir = freshSocketDir();
    const node = await startNode({ model: exampleModel, tensorParallelSize: 2, device: 'cuda', cudaHandles: 'fd', socketDir, logger: pino({ level: 'silent' }) });
    try {
      await node.ready;
      const probe = await cudaProbe();
      const handles = [];
      const mismatched: string[] = [];
      for (const rank of [0, 1]) {
        const client = await WeightdClient.connect(socketPathFor(socketDir, probe.devices[rank]!.uuid));
        const expected = await expectedFingerprint(exampleModel, 2, rank);
        const state = await client.getState(expected, 'copy');
        if (state.status !== 'ok') throw new Error(`rank ${rank}: ${JSON.stringify(state)}`);
        handles.push(...state.segments.map((seg) => seg.handle));
        await client.detach(state.leaseId);
        const copied = await client.copy(expected);
        if (copied.status !== 'copied') throw new Error(`rank ${rank}: ${JSON.stringify(copied)}`);
        for (const [name, want] of expectedRank(exampleModel, 2, rank)) {
          const data = copied.tensors[name]?.data;
          if (!data || !Buffer.from(data.buffer, data.byteOffset, data.byteLength).equals(want.bytes)) mismatched.push(`rank ${rank} ${name}`);
        }
        const attached = await client.attach(expected);
        if (attached.status !== 'attached') throw new Error(`rank ${rank}: ${JSON.stringify(attached)}`);
        await attached.detach();
        client.close();
      }
      return { states: node.status().ranks.map((r) => r.state), handles: [...new Set(handles)], mismatched, fdsLeft: openVmmFds() };
    } finally {
      await node.stop('test');
    }
  },

  /**
   * A partial update on --cuda-handles fd (segments of about 1 MiB) through the daemon: which
   * memory each version's segments are in the node's status (the desk's names, carried by the
   * model control to the written version's ranks; writtenSharesMemory checks the desk and the
   * adoption alone), and what the eviction plan takes for a load short of just more than the one
   * written segment (evicting the base alone frees only that segment: the rest is shared).
   */
  async cudaSharedEviction() {
    const dir = mkdtempSync(join(process.cwd(), 'test', 'artifacts', 'cuda-shared-'));
    try {
      const planFile = join(dir, 'plan.json');
      writeFileSync(planFile, JSON.stringify({ rules: [], segmentBytes: MiB }));
      const node = await startNode({ model: exampleModel, planFile, keepVersions: 1, device: 'cuda', cudaHandles: 'fd', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
      try {
        const socket = (await node.ready).ranks[0]!.socketPath!;
        const plan = (await planCheckpoint(exampleModel, { tpSize: 1, planFile })).ranks[0]!;
        await writePartially(socket, 'tiny-llama', plan.tensors.find((t) => t.segment === 1)!.name, 0);
        const models = node.status().models;
        const segments = models.map((m) => m.ranks[0]!.segments!);
        const written = segments[1]![1]!.bytes;
        const plan0 = planEviction([{ pool: poolOf(models[0]!.ranks[0]!.device!), neededBytes: written + 1, freeBytes: 0 }], models);
        return {
          versions: models.map((m) => m.version),
          sameMemory: segments[0]!.map((s, i) => s.memory !== undefined && s.memory === segments[1]![i]!.memory),
          evicted: 'evict' in plan0 ? plan0.evict.map((e) => e.model.version) : plan0,
        };
      } finally {
        await node.stop('test');
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },

  /**
   * `weightd verify --name --version` of a cuda written version (a partial update): its
   * allocations digested against the commit's digests; then again after one byte of a written
   * tensor is flipped in device memory (the fake's allocation is a memfd, and the descriptor the
   * daemon exports is that memfd, so a write to it is a write to the GPU's memory).
   */
  async cudaVerifyWritten() {
    const dir = mkdtempSync(join(process.cwd(), 'test', 'artifacts', 'cuda-verify-'));
    try {
      const planFile = join(dir, 'plan.json');
      writeFileSync(planFile, JSON.stringify({ rules: [], segmentBytes: MiB }));
      const socketDir = freshSocketDir();
      const node = await startNode({ model: exampleModel, planFile, device: 'cuda', cudaHandles: 'fd', socketDir, logger: pino({ level: 'silent' }) });
      try {
        const socket = (await node.ready).ranks[0]!.socketPath!;
        const plan = (await planCheckpoint(exampleModel, { tpSize: 1, planFile })).ranks[0]!;
        const tensor = plan.tensors.find((t) => t.segment === 1 && t.bytes > 0)!;
        const { version } = await writePartially(socket, 'tiny-llama', tensor.name, 0);
        const verify = async () => {
          const lines: string[] = [];
          // SCENARIO_VERIFY_DIGEST_ON: the request's digestOn, as a caller in code passes it.
          const digestOn = process.env.SCENARIO_VERIFY_DIGEST_ON as 'gpu' | 'cpu' | undefined;
          return { code: await verifyWritten({ name: 'tiny-llama', version, socketDir, ...(digestOn ? { digestOn } : {}) }, (l) => lines.push(l)), lines };
        };
        const intact = await verify();
        const client = await WeightdClient.connect(socket);
        const fingerprint = (await client.ping()).models!.find((m) => m.version === version)!.fingerprint;
        const state = await client.getState({ fingerprint }, 'copy');
        if (state.status !== 'ok') throw new Error(JSON.stringify(state));
        const fds = await client.segmentFds(state.leaseId);
        const at = state.tensors.find((t) => t.name === tensor.name)!;
        const byte = Buffer.alloc(1);
        readSync(fds.get(at.segment)!, byte, 0, 1, at.offset);
        byte[0] = byte[0]! ^ 0xff;
        writeSync(fds.get(at.segment)!, byte, 0, 1, at.offset);
        for (const fd of fds.values()) addon().closeFd(fd);
        await client.detach(state.leaseId);
        client.close();
        return { tensor: tensor.name, intact, flipped: await verify() };
      } finally {
        await node.stop('test');
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },

  /**
   * A node with --cuda-handles fd and a spawned keeper, stopped and started again: the second
   * adopts both ranks' VMM descriptors from the keeper (the fake driver's memory outlives the
   * first node as the keeper's descriptors do the real driver's) and serves the same bytes.
   */
  daemonFdRestart: () => fdRestart(),
  /**
   * The same with rank 1's record dropped from the keeper between the two nodes: rank 0 adopts,
   * rank 1 fills from the files alone. Its fill group was made for both GPUs; rank 0 leaves it
   * (leaveFillGroup), or rank 1 would wait for it for ever.
   */
  daemonFdRestartOneDropped: () => fdRestart(1),

  daemonFdRestartHere: () => fdRestartHere(false),
  daemonFdRestartCorrupt: () => fdRestartHere(true),


  /**
   * A cuda written version (a partial update, segments of about 1 MiB) kept by a spawned keeper:
   * a daemon (a child process: a record's owner must be gone for its written version to be
   * restored) writes it and stops; a node started here adopts both versions from the keeper.
   * Which versions serve, the written one's bytes, which segments the two share as one memory,
   * and what eviction takes for a load short of just more than the written segment.
   */
  async cudaWrittenRestart() {
    const dir = mkdtempSync(join(process.cwd(), 'test', 'artifacts', 'cuda-restart-'));
    const socketDir = freshSocketDir();
    const planFile = join(dir, 'plan.json');
    writeFileSync(planFile, JSON.stringify({ rules: [], segmentBytes: MiB }));
    const keeper = new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME));
    try {
      const plan = (await planCheckpoint(exampleModel, { tpSize: 1, planFile })).ranks[0]!;
      const written = plan.tensors.find((t) => t.segment === 1 && t.bytes > 0)!.name;
      const first = await startDaemon({ model: exampleModel, device: 'cuda', socketDir, extraArgs: ['--cuda-handles', 'fd', '--keeper', 'spawn', '--plan-file', planFile] });
      const socket = socketPathFor(socketDir, (await cudaProbe()).devices[0]!.uuid);
      try {
        await writePartially(socket, 'tiny-llama', written, 0);
        // The written version is kept once it serves, by its rank's keep phase: ask until it is.
        while ((await keeper.list()).length < 2);
      } finally {
        await first.stop();
      }
      const node = await startNode({ model: exampleModel, planFile, device: 'cuda', cudaHandles: 'fd', socketDir, keeper: { mode: 'spawn', adoptWithinS: 60 }, logger: pino({ level: 'silent' }) });
      try {
        await node.ready;
        const models = node.status().models;
        const client = await WeightdClient.connect(socket);
        const copied = await client.copy({ fingerprint: (await client.ping()).models!.find((m) => m.version === 1)!.fingerprint });
        if (copied.status !== 'copied') throw new Error(`version 1: ${JSON.stringify(copied)}`);
        const mismatched = [...expectedRank(exampleModel, 1, 0)].flatMap(([name, want]) => {
          const data = copied.tensors[name]?.data;
          const expected = name === written ? Buffer.alloc(want.bytes.length, 0xab) : want.bytes;
          return data && Buffer.from(data.buffer, data.byteOffset, data.byteLength).equals(expected) ? [] : [name];
        });
        client.close();
        const segments = models.map((m) => m.ranks[0]!.segments ?? []);
        const evict = planEviction([{ pool: poolOf(models[0]!.ranks[0]!.device!), neededBytes: segments[1]![1]!.bytes + 1, freeBytes: 0 }], models);
        return {
          versions: models.map((m) => [m.version, m.current, m.ranks[0]!.source?.from]),
          mismatched,
          sameMemory: segments[0]!.map((s, i) => s.memory !== undefined && s.memory === segments[1]?.[i]?.memory),
          evicted: 'evict' in evict ? evict.evict.map((e) => e.model.version) : evict,
        };
      } finally {
        await node.stop('test');
      }
    } finally {
      const pid = await keeper.ping().then((p) => p.pid, () => undefined);
      if (pid !== undefined) process.kill(pid, 'SIGTERM');
      rmSync(dir, { recursive: true, force: true });
    }
  },

  /** Run with FAKE_CUDA_NO_FD_HANDLES=1: the probe says why, and an fd device refuses to open. */
  /** Run with FAKE_CUDA_QUERY_LOG: probes asked at once and after describe each device to the driver once. */
  async probedOnce() {
    const answers = await Promise.all([cudaProbe(), cudaProbe()]);
    answers.push(await cudaProbe());
    return {
      same: answers.every((a) => JSON.stringify(a) === JSON.stringify(answers[0])),
      devices: answers[0]!.devices.length,
      described: readFileSync(process.env.FAKE_CUDA_QUERY_LOG!, 'utf8').trim().split('\n'),
    };
  },

  async vmmUnsupported() {
    const probe = await cudaProbe();
    return {
      reason: probe.devices[0]!.fdHandlesUnsupported,
      open: await outcome(() => new DeviceHandle('cuda', 0, { cudaHandles: 'fd' })),
      badOption: await outcome(() => new DeviceHandle('cuda', 0, { cudaHandles: 'posix' as 'fd' })),
      ipc: await outcome(() => new DeviceHandle('cuda', 0, { cudaHandles: 'ipc' }).free()),
    };
  },

  async ipcClient([handle, offset, wantPath]) {
    const want = readFileSync(wantPath!);
    const seg = CudaIpcSegment.open(0, handle!);
    const again = CudaIpcSegment.open(0, handle!);
    const equal = Buffer.from(await seg.read(Number(offset), want.length)).equals(want);
    let outOfRange = 'read';
    try {
      await seg.read(seg.bytes - 1, 2);
    } catch (err) {
      outOfRange = (err as { code: string }).code;
    }
    seg.close();
    seg.close();
    // Opens are counted: the second one still maps the segment after the first is closed.
    const stillOpen = Buffer.from(await again.read(Number(offset), want.length)).equals(want);
    again.close();
    let afterClose = 'read';
    try {
      await again.read(0, 1);
    } catch (err) {
      afterClose = (err as { code: string }).code;
    }
    // A close() asked for while a read is held in the driver (the fake's cuMemcpyDtoH waits at a
    // FIFO only this thread opens) waits for it: the read lands, then the segment is unmapped.
    const third = CudaIpcSegment.open(0, handle!);
    const gate = join(dirname(wantPath!), 'dtoh-gate');
    execFileSync('mkfifo', [gate]);
    process.env.FAKE_CUDA_DTOH_GATE = gate;
    const reading = third.read(Number(offset), want.length); // the first chunk's copy is queued by now
    third.close();
    writeFileSync(gate, 'x');
    delete process.env.FAKE_CUDA_DTOH_GATE;
    const closeDuringRead = { landed: Buffer.from(await reading).equals(want), after: await outcome(() => third.read(0, 1)) };
    return { equal, bytes: seg.bytes, samePointer: again.pointer === seg.pointer, outOfRange, stillOpen, afterClose, closeDuringRead };
  },
};

/** daemonFdRestart, with `dropRank`'s record dropped from the keeper before the second node starts. */
async function fdRestart(dropRank?: number) {
  const socketDir = freshSocketDir();
  const options = { model: exampleModel, tensorParallelSize: 2, device: 'cuda', cudaHandles: 'fd', socketDir, keeper: { mode: 'spawn', adoptWithinS: 60 }, logger: pino({ level: 'silent' }) } as const;
  const keeper = new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME));
  try {
    const first = await startNode(options);
    await first.ready;
    while (!first.status().ranks.every((r) => r.kept)) await new Promise((r) => setTimeout(r, 10));
    await first.stop('test');
    if (dropRank !== undefined) await keeper.drop((await cudaProbe()).devices[dropRank]!.uuid);
    const second = await startNode(options);
    const mismatched: string[] = [];
    try {
      await second.ready;
      const probe = await cudaProbe();
      for (const rank of [0, 1]) {
        const client = await WeightdClient.connect(socketPathFor(socketDir, probe.devices[rank]!.uuid));
        const copied = await client.copy(await expectedFingerprint(exampleModel, 2, rank));
        if (copied.status !== 'copied') throw new Error(`rank ${rank}: ${JSON.stringify(copied)}`);
        for (const [name, want] of expectedRank(exampleModel, 2, rank)) {
          const data = copied.tensors[name]?.data;
          if (!data || !Buffer.from(data.buffer, data.byteOffset, data.byteLength).equals(want.bytes)) mismatched.push(`rank ${rank} ${name}`);
        }
        client.close();
      }
      // A rank that filled is kept once it serves: wait for it (the scenario's timeout bounds this).
      while (!second.status().ranks.every((r) => r.kept)) await new Promise((r) => setTimeout(r, 10));
      return { sources: second.status().ranks.map((r) => r.source?.from), kept: second.status().ranks.map((r) => r.kept), mismatched };
    } finally {
      await second.stop('test');
    }
  } finally {
    const pid = await keeper.ping().then((p) => p.pid, () => undefined);
    if (pid !== undefined) process.kill(pid, 'SIGTERM');
  }
}

/**
 * A restart that adopts cuda-fd shards makes no CUDA context before READY (issue 33): the fake's
 * cuDevicePrimaryCtxRetain waits at a FIFO (FAKE_CUDA_RETAIN_GATE) for the whole second start,
 * and logs each retain done (FAKE_CUDA_RETAIN_LOG). At READY: which contexts exist, where each
 * rank adopted, its descriptors' state and free memory; then a client's copy, asked while the
 * check waits, and whether it was still waiting; then, the gate opened, the same after the check.
 * `corrupt`: before the restart, GPU 0's record is kept again with GPU 1's VMM allocations as its
 * descriptors (the record itself unchanged): how the client's copy ends, how the node ends, and
 * whether the keeper still holds GPU 0's shard.
 */
async function fdRestartHere(corrupt: boolean) {
  const socketDir = freshSocketDir();
  const dir = mkdtempSync(join(process.cwd(), 'test', 'artifacts', 'fd-here-'));
  const gate = join(dir, 'retain-gate');
  const retainLog = join(dir, 'retains');
  execFileSync('mkfifo', [gate]);
  const contexts = () => readFileSync(retainLog, { encoding: 'utf8', flag: 'a+' }).split('\n').filter(Boolean).length;
  const options = { model: exampleModel, tensorParallelSize: 2, device: 'cuda', cudaHandles: 'fd', socketDir, keeper: { mode: 'spawn', adoptWithinS: 60 }, logger: pino({ level: 'silent' }) } as const;
  const keeper = new KeeperClient(join(socketDir, KEEPER_SOCKET_NAME));
  const probe = await cudaProbe();
  const uuids = probe.devices.map((d) => d.uuid);
  try {
    const first = await startNode(options);
    await first.ready;
    while (!first.status().ranks.every((r) => r.kept)) await new Promise((r) => setTimeout(r, 10));
    await first.stop('test');
    if (corrupt) {
      const kept = (await keeper.list()).find((r) => r.device === uuids[0])!;
      const taken = await keeper.take(uuids[0]!, kept.fingerprint);
      const other = new DeviceHandle('cuda', 1, { cudaHandles: 'fd' });
      await other.allocate(taken.fds.map(() => MiB));
      await keeper.keep(uuids[0]!, kept.fingerprint, taken.record, other.exportSegments().map((x) => x.fd!));
      for (const fd of taken.fds) addon().closeFd(fd);
      await other.free();
    }
    // Which requests wait for a rank's check (get_segment_fds, begin_update), by global rank: the
    // check is released only once every one asked has reached it, not after a guessed delay.
    const waitingFor = new Map<number, number>();
    const untilChecked = RankService.prototype.untilDescriptorsChecked;
    RankService.prototype.untilDescriptorsChecked = function (this: RankService) {
      waitingFor.set(this.rank.globalRank, (waitingFor.get(this.rank.globalRank) ?? 0) + 1);
      return untilChecked.call(this);
    };
    // O_RDWR: never blocks, and keeps a writer on the FIFO for the fake's readers.
    const gateFd = openSync(gate, 'r+');
    process.env.FAKE_CUDA_RETAIN_GATE = gate;
    process.env.FAKE_CUDA_RETAIN_LOG = retainLog;
    const second = await startNode(options);
    const mismatched: string[] = [];
    const rankStates = () => second.status().ranks.map((r) => ({ adoptedOn: r.source?.from === 'keeper' ? r.source.thread : undefined, descriptors: r.descriptors, freeProbed: r.device?.freeProbed ?? true }));
    const checkedMetric = async () => [...(await second.metrics()).matchAll(/^weightd_rank_descriptors_checked\{[^}]*\} (\d)$/gm)].map((m) => Number(m[1]));
    try {
      await second.ready;
      const atReady = { contexts: contexts(), ranks: rankStates(), metric: await checkedMetric() };
      const clients = await Promise.all(uuids.map((uuid) => WeightdClient.connect(socketPathFor(socketDir, uuid))));
      let settled = false;
      const copies = clients.map(async (client, rank) => {
        const copied = await client.copy(await expectedFingerprint(exampleModel, 2, rank));
        if (copied.status !== 'copied') throw new Error(`rank ${rank}: ${JSON.stringify(copied)}`);
        for (const [name, want] of expectedRank(exampleModel, 2, rank)) {
          const data = copied.tensors[name]?.data;
          if (!data || !Buffer.from(data.buffer, data.byteOffset, data.byteLength).equals(want.bytes)) mismatched.push(`rank ${rank} ${name}`);
        }
        return 'copied';
      });
      const outcomes = Promise.all(copies.map((c) => c.then((x) => x, (err: { code?: string }) => err.code ?? String(err)))).finally(() => (settled = true));
      // An update of GPU 0's shard begun meanwhile: no copy of memory that has yet to pass its check.
      let updateSettled = false;
      const update = corrupt ? beginUpdateOutcome(socketPathFor(socketDir, uuids[0]!), (await expectedFingerprint(exampleModel, 2, 0)).fingerprint).finally(() => (updateSettled = true)) : undefined;
      // Each client's get_segment_fds, and GPU 0's begin_update when corrupt.
      while ((waitingFor.get(0) ?? 0) < (corrupt ? 2 : 1) || (waitingFor.get(1) ?? 0) < 1) {
        if (settled || updateSettled) break;
        await new Promise((r) => setTimeout(r, 10));
      }
      const waitedForCheck = !settled && !updateSettled;
      delete process.env.FAKE_CUDA_RETAIN_GATE;
      writeSync(gateFd, 'xx');
      const copied = await outcomes;
      for (const client of clients) client.close();
      if (corrupt) {
        const ended = await second.done;
        return { atReady, waitedForCheck, copied, update: await update, ended: ended.state, failure: ended.failure?.code, stillKept: (await keeper.list()).map((r) => r.device === uuids[0]) };
      }
      while (second.status().ranks.some((r) => r.descriptors === 'checking')) await new Promise((r) => setTimeout(r, 10));
      return { atReady, waitedForCheck, copied, mismatched, afterCheck: { contexts: contexts(), ranks: rankStates(), metric: await checkedMetric() } };
    } finally {
      RankService.prototype.untilDescriptorsChecked = untilChecked;
      delete process.env.FAKE_CUDA_RETAIN_GATE;
      writeSync(gateFd, 'xxxx');
      await second.stop('test');
      closeSync(gateFd);
    }
  } finally {
    const pid = await keeper.ping().then((p) => p.pid, () => undefined);
    if (pid !== undefined) process.kill(pid, 'SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A begin_update of tiny-llama's version `base` on `socket`, its connection closed after the reply: "begun" (its descriptors closed, the update ended with the connection), or the refusal's code. */
async function beginUpdateOutcome(socket: string, base: string): Promise<string> {
  const request = encodeFrame(JSON.stringify({ id: 1, cmd: 'begin_update', model: 'tiny-llama', base, tensors: ['model.norm.weight'] }));
  const { frame, fds } = await addon().unixRequest(socket, request, [], 30_000, MAX_RESPONSE_BYTES);
  for (const fd of fds) addon().closeFd(fd);
  const reply = JSON.parse(frame.subarray(FRAME_HEADER_BYTES).toString('utf8')) as { ok: boolean; error?: { code: string } };
  return reply.ok ? 'begun' : reply.error!.code;
}

/** Descriptors of fake VMM memory this process holds (the daemon's own exports included). */
function openVmmFds(): number {
  return readdirSync('/proc/self/fd').filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`).startsWith('/memfd:fakecuda-vmm-');
    } catch {
      return false;
    }
  }).length;
}

function outcomeSync(fn: () => unknown): string {
  try {
    fn();
    return 'open';
  } catch (err) {
    return (err as { code?: string }).code ?? String(err);
  }
}

/**
 * The TypeScript client's path for a "cuda-fd" rank: openCuda given get_segment_fds' reply (here
 * reopened descriptors of the exported memory), one tensor per op of segment 0 read back, the
 * descriptors closed; without the reply it refuses.
 */
async function openAsClient(exported: SegmentExport[], fds: number[], fx: Fixture): Promise<unknown> {
  const tensors = fx.ops.flatMap((op, i) => (op.segment === 0 ? [{ name: `op${i}`, dtype: 'U8', shape: [op.rows * op.rowBytes], segment: 0, offset: op.dstOffset, bytes: op.rows * op.rowBytes }] : []));
  const state = {
    device: { uuid: cudaDevices(await cudaProbe())[1]!.uuid },
    rank: { globalRank: 0 },
    segments: exported.map(({ segment, bytes, handle }) => ({ segment, bytes, handle })),
    tensors,
    aliases: {},
  } as unknown as StateReply;
  const withoutFds = await outcome(() => openCuda(state, 1));
  // Fresh descriptors of the same memory, as get_segment_fds delivers them: openCuda closes them.
  const received = new Map([1, 0].map((n) => [n, openSync(`/proc/self/fd/${fds[n]}`, 'r+')]));
  const opened = await openCuda(state, 1, received);
  const closedByOpen = [...received.values()].map((fd) => outcomeSync(() => fstatSync(fd)));
  try {
    const read = await opened.read();
    const equal = fx.ops.every((op, i) => op.segment !== 0 || Buffer.from((read[`op${i}`]!.data as Uint8Array).buffer).equals(expectedBytes(fx.data[op.file]!, op)));
    // The fake maps device memory as host memory, with the access the client asked the driver for.
    const first = Object.values(opened.tensors)[0]!.pointer;
    const access = readFileSync('/proc/self/maps', 'utf8').split('\n').map((l) => l.split(' ')).find(([range]) => {
      const [lo, hi] = range!.split('-').map((h) => BigInt(`0x${h}`));
      return lo! <= first && first < hi!;
    })?.[1];
    return { equal, withoutFds, closedByOpen, access };
  } finally {
    opened.close();
  }
}

/** Runs vmmChild with the descriptors as its fds 3, 4, ... (spawn dup2s them there, as a process inheriting them would). */
async function adoptInChild(fds: number[], fx: Fixture): Promise<unknown> {
  const child = spawn(process.execPath, [fileURLToPath(import.meta.url), 'vmmChild', JSON.stringify(fx.paths), JSON.stringify(fx.ops), JSON.stringify(fx.segments)], {
    stdio: ['ignore', 'pipe', 'pipe', ...fds],
  });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => (out += d));
  child.stderr!.on('data', (d: Buffer) => (err += d));
  const code = await new Promise<number | null>((resolveExit) => child.on('close', resolveExit));
  if (code !== 0) throw new Error(`the adopting child failed (${code}): ${err}`);
  const leakLine = err.split('\n').find((l) => l.startsWith('FAKE_CUDA_LEAKS '));
  return { ...JSON.parse(out.trim().split('\n').pop()!), leaks: leakLine ? JSON.parse(leakLine.slice('FAKE_CUDA_LEAKS '.length)) : null };
}

const [name, ...args] = process.argv.slice(2);
const run = scenarios[name ?? ''];
if (!run) {
  console.error(`unknown scenario ${name}; one of ${Object.keys(scenarios).join(', ')}`);
  process.exit(2);
}
try {
  console.log(JSON.stringify(await run(args)));
} catch (err) {
  console.error((err as Error).stack);
  process.exit(1);
}
