// Client-side mappings of host segments: unmapping is immediate, a detached buffer's late
// finalizer never unmaps a newer mapping that mmap placed at the same address, and only a
// descriptor sealed as a served segment, long enough, is mapped.
import { closeSync, openSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { addon } from '../../src/native/addon.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { freshTempDir } from '../helpers/paths.js';

const MiB = 1 << 20;

/** A served segment of `bytes` bytes of 7s: a host device filled and exported (sealed). */
async function sealedSegment(bytes: number): Promise<{ fd: number; device: DeviceHandle }> {
  const file = join(freshTempDir(), 'sevens');
  writeFileSync(file, Buffer.alloc(bytes, 7));
  const device = new DeviceHandle('host', 0, { uuid: `mapping-${process.pid}` });
  await device.allocate([bytes]);
  await device.fill([file], [{ file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: bytes, srcPitch: 0 }], bytes, {});
  return { fd: device.exportSegments()[0]!.fd!, device };
}

test('map, unmap, map again at the same address, then collect: the new mapping stays valid', async () => {
  const { fd, device } = await sealedSegment(MiB);
  try {
    const kept: ArrayBuffer[] = [];
    for (let i = 0; i < 200; i++) {
      const old = addon().mapShared(fd, MiB);
      addon().unmapShared(old);
      assert.is(old.byteLength, 0, 'an unmapped buffer is detached');
      kept.push(addon().mapShared(fd, MiB));
    }
    // Let the detached buffers' finalizers run (gc is exposed by the runner when available).
    for (let i = 0; i < 3; i++) {
      (globalThis as { gc?: () => void }).gc?.();
      await new Promise((r) => setTimeout(r, 20));
    }
    for (const b of kept) assert.is(new Uint8Array(b)[4096], 7);
    for (const b of kept) addon().unmapShared(b);
  } finally {
    await device.free();
  }
});

test('a mapping outlives the device that served it: its pages go with the last mapping', async () => {
  const { fd, device } = await sealedSegment(MiB);
  const view = addon().mapShared(fd, MiB);
  await device.free();
  assert.is(new Uint8Array(view)[MiB - 1], 7);
  addon().unmapShared(view);
});

test('a descriptor that is not a sealed segment, or is too short, is refused with a clear error', async () => {
  const file = join(freshTempDir(), 'plain');
  writeFileSync(file, Buffer.alloc(8192));
  const plain = openSync(file, 'r');
  try {
    assert.throws(() => addon().mapShared(plain, 4096), /descriptor \d+ is not a sealable memfd: .*; refusing to map it/);
  } finally {
    closeSync(plain);
  }
  const { fd, device } = await sealedSegment(4096);
  try {
    assert.throws(() => addon().mapShared(fd, 8192), /holds 4096 bytes, fewer than the segment's 8192/);
  } finally {
    await device.free();
  }
});

test.run();
