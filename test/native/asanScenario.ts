// Child process of asan.test.ts, run with the AddressSanitizer runtime preloaded: drives the host
// backend and the bindings through every path that owns native memory or descriptors (allocate,
// fill, export (sealing), adopt, read, map and unmap, free, peer credentials; each error path; a cancelled
// fill; a worker thread ended in the middle of a fill). It ends by draining its event loop, never
// by process.exit(), so Node tears its own heap down and LeakSanitizer's report at exit holds
// only what was really lost. Prints one JSON line: what it saw. Calls that may block are awaited,
// whether the addon answers them now or through a Promise. Its argument: an empty directory,
// which the test removes (a sanitizer's abort skips this process's exit handlers).
import { asanAddonPath } from './asanAddon.js';
import { once } from 'node:events';
import { closeSync, openSync, readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { createConnection, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import type { CopyOp } from '../../src/checkpoint/types.js';
import { addon } from '../../src/native/addon.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { expectedBytes } from '../helpers/expectedBytes.js';

const MiB = 1 << 20;
const dir = process.argv[2]!;
/** Each error path's code ("no error" where the call succeeded). */
const codes: Record<string, string> = {};

async function capture(name: string, fn: () => unknown): Promise<void> {
  try {
    await fn();
    codes[name] = 'no error';
  } catch (err) {
    codes[name] = (err as { code?: string }).code ?? String(err);
  }
}

/** What of `dir`, and which host segments (memfds), this process still holds: open descriptors and mappings. */
function heldFiles(): string[] {
  const fds = readdirSync('/proc/self/fd').flatMap((fd) => {
    try {
      return [readlinkSync(`/proc/self/fd/${fd}`)];
    } catch {
      return []; // the descriptor readdir itself used, closed by now
    }
  });
  const maps = readFileSync('/proc/self/maps', 'utf8').split('\n').map((l) => l.split(/\s+/).slice(5).join(' '));
  return [...new Set([...fds, ...maps].filter((p) => p.startsWith(dir) || p.startsWith('/memfd:weightd:')))];
}

/** The checkpoint: one contiguous op and one strided op (a row-parallel slice), with a zero range. */
const data = Buffer.alloc(3 * MiB);
for (let i = 0; i < data.length; i++) data[i] = (i * 131 + (i >> 12)) & 0xff;
const file = join(dir, 'weights.bin');
writeFileSync(file, data);
const ops: CopyOp[] = [
  { file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: 2 * MiB, srcPitch: 0 },
  { file: 0, segment: 1, srcOffset: 2 * MiB, dstOffset: 0, rows: 256, rowBytes: 1024, srcPitch: 4096 },
];
const segmentBytes = [2 * MiB, 256 * 1024 + 4096];
const zeroRanges = [{ segment: 1, offset: 256 * 1024, bytes: 4096 }];

// A bigger file for the fills that are cut short: 256 chunks of 64 KiB for one reader thread.
// Small, so the scenario stays quick under the sanitizer.
const bigBytes = 16 * MiB;
const big = join(dir, 'big.bin');
writeFileSync(big, Buffer.alloc(bigBytes, 1));
const bigOp: CopyOp = { file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: bigBytes, srcPitch: 0 };

// One arena's whole life.
const device = new DeviceHandle('host', 0, { uuid: `asan-${process.pid}` });
await capture('fillBeforeAllocate', () => device.fill([file], ops, 0, {}));
await device.allocate(segmentBytes);
await capture('allocateTwice', () => device.allocate([4096]));
await device.fill([file], ops, 2 * MiB + 256 * 1024, { threads: 2, chunkBytes: 256 * 1024, zeroRanges });
// Refused before a byte moves, so the arena keeps the fill's bytes for the checks below.
await capture('pastEnd', () => device.fill([file], [{ ...ops[0]!, srcOffset: data.length - 10 }], 0, {}));
await capture('missingFile', () => device.fill([join(dir, 'missing.bin')], ops, 0, {}));
const segments = device.exportSegments();
let readBack = true;
for (const op of ops) readBack &&= (await device.read(op.segment, op.dstOffset, op.rows * op.rowBytes)).equals(expectedBytes(data, op));
const mapped = ops.every((op) => {
  const s = segments[op.segment]!;
  const view = addon().mapShared(s.fd!, s.bytes);
  const ok = Buffer.from(view, op.dstOffset, op.rows * op.rowBytes).equals(expectedBytes(data, op)) && new Uint8Array(view)[s.bytes - 1] === (op.segment === 1 ? 0 : data[2 * MiB - 1]);
  addon().unmapShared(view);
  return ok;
});
await capture('fillSealed', () => device.fill([file], ops, 0, {}));
// Another device adopts the exported arena through descriptors of its own (a reopen of
// /proc/self/fd/N is a new descriptor of the same memfd, seals included), as a restarted daemon
// adopts what the keeper held; then refuses descriptors that are not sealed segments.
const reopen = (fd: number) => openSync(`/proc/self/fd/${fd}`, 'r');
const adopter = new DeviceHandle('host', 3, { uuid: `asan-adopt-${process.pid}` });
await adopter.adopt(segments.map((s) => reopen(s.fd!)), segmentBytes);
let adoptedBack = true;
for (const op of ops) adoptedBack &&= (await adopter.read(op.segment, op.dstOffset, op.rows * op.rowBytes)).equals(expectedBytes(data, op));
await capture('fillAdopted', () => adopter.fill([file], ops, 0, {}));
await adopter.free();
await capture('adoptUnsealed', () => adopter.adopt([openSync(file, 'r')], [4096]));
await capture('adoptShort', () => adopter.adopt(segments.map((s) => reopen(s.fd!)), [segmentBytes[0]!, 4 * MiB]));
await capture('adoptCount', () => adopter.adopt([reopen(segments[0]!.fd!)], segmentBytes));
await capture('readOutOfRange', () => device.read(1, segmentBytes[1]! - 10, 11));
await device.free();
await capture('exportAfterFree', () => device.exportSegments());

await capture('badBackend', () => new DeviceHandle('no-such-backend' as never, 0));
await capture('tooBig', () => new DeviceHandle('host', 0, { uuid: 'asan-too-big' }).allocate([2 ** 52]));
const notSocket = openSync(file, 'r');
await capture('mapUnsealed', () => addon().mapShared(notSocket, 4096));
await capture('peerOfFile', () => addon().peerCredentials(notSocket));
closeSync(notSocket);
const residency = await addon().pageCacheResidency([file, big]);

// A fill cancelled as soon as it starts (or, were the machine fast enough, just finished).
const cancelled = new DeviceHandle('host', 1, { uuid: `asan-cancel-${process.pid}` });
await cancelled.allocate([bigBytes]);
const filling = cancelled.fill([big], [bigOp], bigBytes, { threads: 1, chunkBytes: 64 * 1024 });
cancelled.cancelFill();
await capture('cancel', () => filling);
await cancelled.fill([file], [ops[0]!], 2 * MiB, {});
// Freed while a fill still runs: the free stops the fill before it unmaps (FillJob::stop), and
// the fill's poller hears it was cancelled.
const freedWhileFilling = cancelled.fill([big], [bigOp], bigBytes, { threads: 1, chunkBytes: 64 * 1024 });
await cancelled.free();
await capture('freeWhileFilling', () => freedWhileFilling);

// The peer credentials of a real connection, as the rank server reads them.
const socketPath = join(dir, 'peer.sock');
const server = createServer();
server.listen(socketPath);
await once(server, 'listening');
const accepted = once(server, 'connection') as Promise<[Socket]>;
const client = createConnection(socketPath);
await once(client, 'connect');
const [conn] = await accepted;
const peer = addon().peerCredentials((conn as unknown as { _handle: { fd: number } })._handle.fd);
client.destroy();
conn.destroy();
server.close();
await once(server, 'close');

// A worker thread ended while it fills: its addon instance frees the device at teardown.
const worker = new Worker(new URL('./asanWorker.js', import.meta.url), { workerData: { op: bigOp, file: big } });
const [workerState] = (await once(worker, 'message')) as [string];
await worker.terminate();

const held = heldFiles();

// A mapping dropped without unmapShared: its finalizer unmaps it, when a collection runs (the
// memfd's pages live until then, though its device is freed first).
const dropped = new DeviceHandle('host', 4, { uuid: `asan-dropped-${process.pid}` });
await dropped.allocate([4096]);
const [droppedSegment] = dropped.exportSegments();
await capture('mapTooSmall', () => addon().mapShared(droppedSegment!.fd!, 8192));
addon().mapShared(droppedSegment!.fd!, 4096);
await dropped.free();
const gc = (globalThis as { gc?: () => void }).gc;
for (let i = 0; i < 3; i++) {
  gc?.();
  await new Promise((r) => setImmediate(r));
}

const maps = readFileSync('/proc/self/maps', 'utf8');
// Proof that the check ran at all: the runtime is in, and the addon is the instrumented one.
const loaded = { asanRuntime: /\/libasan\.so/.test(maps), asanAddon: maps.includes(asanAddonPath) };
console.log(
  JSON.stringify({
    loaded,
    readBack,
    mapped,
    adoptedBack,
    codes,
    residencyFiles: residency.totalBytes === data.length + bigBytes,
    peer: peer.pid === process.pid && peer.uid === process.getuid!(),
    workerState,
    held,
  }),
);
