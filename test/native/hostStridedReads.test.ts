// A row-parallel (strided) op reads only its rows once the gaps between them are worth skipping
// (native/read_ranges.h), and its whole span when they are not; either way the arena holds
// exactly the rows, sliced the plain way. What the fill read is this process's rchar
// (/proc/self/io), which counts every byte its read calls returned: the fill's reader threads
// are the only ones reading while it runs.
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { CopyOp } from '../../src/checkpoint/types.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { expectedBytes } from '../helpers/expectedBytes.js';
import { freshTempDir } from '../helpers/paths.js';

const KiB = 1024;
/** native/read_ranges.h kMinSkippedGap. */
const MIN_SKIPPED_GAP = 4 * KiB;

const rchar = (): number => Number(/rchar: (\d+)/.exec(readFileSync('/proc/self/io', 'utf8'))![1]);

/** Fills `op` alone from `data` with the given chunk size; returns the bytes read and whether the arena is exact. */
async function fillOne(data: Buffer, op: CopyOp, chunkBytes: number): Promise<{ read: number; exact: boolean }> {
  const dir = freshTempDir();
  const device = new DeviceHandle('host', 0, { uuid: `strided-${process.pid}` });
  try {
    const file = join(dir, 'weights.bin');
    writeFileSync(file, data);
    const payload = op.rows * op.rowBytes;
    await device.allocate([payload]);
    const before = rchar();
    await device.fill([file], [op], payload, { threads: 2, chunkBytes });
    const read = rchar() - before;
    return { read, exact: (await device.read(0, 0, payload)).equals(expectedBytes(data, op)) };
  } finally {
    await device.free();
    rmSync(dir, { recursive: true, force: true });
  }
}

test('a tp=8 row slice (1 KiB of every 8 KiB row) reads its rows only, not the span, and lands exact', async () => {
  const data = randomBytes(4096 * 8 * KiB + 777);
  // Rank 3's slice, starting at an odd offset as a tensor after a safetensors header does.
  const op: CopyOp = { file: 0, segment: 0, srcOffset: 777 + 3 * KiB, dstOffset: 0, rows: 4096, rowBytes: KiB, srcPitch: 8 * KiB };
  const { read, exact } = await fillOne(data, op, 256 * KiB);
  assert.ok(exact, 'the arena differs from the rows sliced out of the file');
  const payload = op.rows * op.rowBytes;
  // The span would be 8x the payload; allow a little for anything else this process reads meanwhile.
  assert.ok(read >= payload && read < payload * 1.1, `read ${read} bytes for a payload of ${payload} (span ${(op.rows - 1) * op.srcPitch + op.rowBytes})`);
});

test('rows whose gaps are shorter than a page are read as one span, and land exact', async () => {
  const pitch = KiB + MIN_SKIPPED_GAP - 1;
  const data = randomBytes(2048 * pitch + 100);
  const op: CopyOp = { file: 0, segment: 0, srcOffset: 99, dstOffset: 0, rows: 2048, rowBytes: KiB, srcPitch: pitch };
  const { read, exact } = await fillOne(data, op, 64 * KiB);
  assert.ok(exact, 'the arena differs from the rows sliced out of the file');
  // Each chunk reads its rows' span (the gap after a chunk's last row is not read): about 5x the payload.
  const payload = op.rows * op.rowBytes;
  assert.ok(read > 4 * payload, `read ${read} bytes for a payload of ${payload}: the rows were read one by one`);
});

test('a gap of exactly a page is skipped; chunks of one row and chunks cutting the op anywhere stay exact', async () => {
  const pitch = 3 * KiB + MIN_SKIPPED_GAP;
  const data = randomBytes(1000 * pitch + 5);
  const op: CopyOp = { file: 0, segment: 0, srcOffset: 5, dstOffset: 0, rows: 1000, rowBytes: 3 * KiB, srcPitch: pitch };
  for (const chunkBytes of [1, pitch, 5 * pitch + 1, 64 * pitch]) {
    const { read, exact } = await fillOne(data, op, chunkBytes);
    assert.ok(exact, `chunkBytes ${chunkBytes}: the arena differs from the rows sliced out of the file`);
    assert.ok(read < op.rows * op.rowBytes * 1.1, `chunkBytes ${chunkBytes}: read ${read} bytes for a payload of ${op.rows * op.rowBytes}`);
  }
});

test('the last row ending at the end of the file is read whole', async () => {
  const data = randomBytes(100 * 16 * KiB);
  const op: CopyOp = { file: 0, segment: 0, srcOffset: 12 * KiB, dstOffset: 0, rows: 100, rowBytes: 4 * KiB, srcPitch: 16 * KiB };
  const { exact } = await fillOne(data, op, 32 * KiB);
  assert.ok(exact, 'the arena differs from the rows sliced out of the file');
});

test.run();
