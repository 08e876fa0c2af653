// Copy ops and zero ranges cross into the addon as packed records (src/native/fillRecords.ts,
// native/fill_records.h). A host fill of records whose fields all differ lands each byte where
// the ops' documented meaning says (src/checkpoint/types.ts), so a field order that differs
// between the two sides, or a record width, fails here.
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { CopyOp, ZeroRange } from '../../src/checkpoint/types.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { COPY_OP_FIELDS, packCopyOps, packZeroRanges, ZERO_RANGE_FIELDS } from '../../src/native/fillRecords.js';
import { randomBytes } from '../helpers/checkpoints.js';
import { freshTempDir } from '../helpers/paths.js';

/** What the arena holds after `ops`, from the meaning of a copy op alone. */
function applyOps(arena: Uint8Array[], files: Uint8Array[], ops: CopyOp[]): void {
  for (const op of ops) {
    for (let r = 0; r < op.rows; r++) {
      const src = files[op.file]!.subarray(op.srcOffset + r * op.srcPitch, op.srcOffset + r * op.srcPitch + op.rowBytes);
      arena[op.segment]!.set(src, op.dstOffset + r * op.rowBytes);
    }
  }
}

test('records pack in field order, one record after another', () => {
  const op: CopyOp = { file: 1, segment: 2, srcOffset: 3, dstOffset: 4, rows: 5, rowBytes: 6, srcPitch: 7 };
  assert.equal([...packCopyOps([op, { ...op, file: 9 }])], [1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 4, 5, 6, 7]);
  assert.equal([...packZeroRanges([{ segment: 1, offset: 2, bytes: 3 }])], [1, 2, 3]);
  assert.is(COPY_OP_FIELDS.length, 7);
  assert.is(ZERO_RANGE_FIELDS.length, 3);
});

test('a host fill reads every field of an op and a zero range where TypeScript packed it', async () => {
  const dir = freshTempDir();
  const device = new DeviceHandle('host', 0, { uuid: `records-${process.pid}` });
  try {
    const files = [randomBytes(1, 4096), randomBytes(2, 4096), randomBytes(3, 4096), new Uint8Array(2000).fill(0xab)];
    const paths = files.map((bytes, i) => {
      const path = join(dir, `file${i}`);
      writeFileSync(path, bytes);
      return path;
    });
    const segments = [1000, 2000];
    await device.allocate(segments);
    // Segment 1 starts non-zero, so the zero range is seen.
    await device.fill(paths, [{ file: 3, segment: 1, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: 2000, srcPitch: 0 }], 2000, {});
    // Every field of a record differs from every other, so no two can trade places unseen.
    const ops: CopyOp[] = [
      { file: 2, segment: 1, srcOffset: 37, dstOffset: 101, rows: 3, rowBytes: 5, srcPitch: 11 },
      { file: 0, segment: 1, srcOffset: 203, dstOffset: 517, rows: 1, rowBytes: 64, srcPitch: 0 },
      { file: 1, segment: 0, srcOffset: 1009, dstOffset: 7, rows: 4, rowBytes: 23, srcPitch: 131 },
    ];
    const zeros: ZeroRange[] = [{ segment: 1, offset: 300, bytes: 29 }];
    await device.fill(paths, ops, 0, { zeroRanges: zeros });
    const want = [new Uint8Array(segments[0]!), new Uint8Array(segments[1]!).fill(0xab)];
    for (const z of zeros) want[z.segment]!.fill(0, z.offset, z.offset + z.bytes);
    applyOps(want, files, ops);
    for (const [s, bytes] of segments.entries()) {
      const got = await device.read(s, 0, bytes);
      const at = got.findIndex((b, i) => b !== want[s]![i]);
      assert.is(at, -1, `segment ${s} byte ${at}: ${got[at]}, expected ${want[s]![at]}`);
    }
  } finally {
    await device.free();
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
