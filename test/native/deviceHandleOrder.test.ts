// DeviceHandle runs a device's calls in the order they were made: the addon refuses to overlap
// them (E_DEVICE_BUSY), so a caller that does not await one call before the next still gets
// each done, in order.
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { freshTempDir } from '../helpers/paths.js';

test('a fill asked for while its allocate still runs starts after it, and a free after both', async () => {
  const dir = freshTempDir();
  const device = new DeviceHandle('host', 0, { uuid: `order-${process.pid}` });
  try {
    const file = join(dir, 'data');
    writeFileSync(file, Buffer.alloc(8192, 0xcd));
    const allocated = device.allocate([8192]);
    const filled = device.fill([file], [{ file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: 8192, srcPitch: 0 }], 8192, {});
    await allocated;
    assert.equal(await filled, { bytes: 8192, seconds: (await filled).seconds, digests: [], digestRereadBytes: 0, digestGpuBytes: 0 });
    const read = device.read(0, 0, 8192);
    const freed = device.free();
    assert.ok((await read).every((b) => b === 0xcd), 'the read ran before the free');
    await freed;
  } finally {
    await device.free();
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
