// The host backend keeps the fill's zero-range contract that the cuda backend keeps (native/
// device.h): a fill writes zeros over exactly its zero ranges, even in an arena an earlier fill
// left non-zero, and refuses a range outside the arena before any byte moves.
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { freshTempDir } from '../helpers/paths.js';

test('a fill zeroes exactly its zero ranges, over bytes an earlier fill wrote', async () => {
  const dir = freshTempDir();
  const device = new DeviceHandle('host', 0, { uuid: `zero-${process.pid}` });
  try {
    const file = join(dir, 'data');
    writeFileSync(file, Buffer.alloc(8192, 0xab));
    await device.allocate([8192]);
    const all = { file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: 8192, srcPitch: 0 };
    await device.fill([file], [all], 8192, {});
    const ranges = [{ segment: 0, offset: 3, bytes: 5 }, { segment: 0, offset: 4096, bytes: 256 }];
    await device.fill([file], [], 0, { zeroRanges: ranges });
    const got = await device.read(0, 0, 8192);
    const zero = (i: number): boolean => ranges.some((z) => i >= z.offset && i < z.offset + z.bytes);
    const wrong = [...got].findIndex((b, i) => b !== (zero(i) ? 0 : 0xab));
    assert.is(wrong, -1, `byte ${wrong} is ${got[wrong]}`);
    try {
      await device.fill([file], [], 0, { zeroRanges: [{ segment: 1, offset: 0, bytes: 1 }] });
      assert.unreachable('a range in a segment the arena lacks was accepted');
    } catch (err) {
      assert.is((err as { code: string }).code, 'E_BAD_PLAN');
      assert.match((err as Error).message, 'zero range 0 (1 bytes at 0 of segment 1) is outside the arena of 1 segment(s)');
    }
  } finally {
    await device.free();
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
