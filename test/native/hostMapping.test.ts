// Client-side mappings of host segments: unmapping is immediate, and a detached buffer's late
// finalizer never unmaps a newer mapping that mmap placed at the same address.
import { rmSync, writeFileSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { addon } from '../../src/native/addon.js';
import { freshShmDir } from '../helpers/paths.js';

test('map, unmap, map again at the same address, then collect: the new mapping stays valid', async () => {
  const dir = freshShmDir();
  try {
    const path = `${dir}/segment`;
    writeFileSync(path, Buffer.alloc(1 << 20, 7), { mode: 0o600 });
    const kept: ArrayBuffer[] = [];
    for (let i = 0; i < 200; i++) {
      const old = addon().mapShared(path, 1 << 20);
      addon().unmapShared(old);
      assert.is(old.byteLength, 0, 'an unmapped buffer is detached');
      kept.push(addon().mapShared(path, 1 << 20));
    }
    // Let the detached buffers' finalizers run (gc is exposed by the runner when available).
    for (let i = 0; i < 3; i++) {
      (globalThis as { gc?: () => void }).gc?.();
      await new Promise((r) => setTimeout(r, 20));
    }
    for (const b of kept) assert.is(new Uint8Array(b)[4096], 7);
    for (const b of kept) addon().unmapShared(b);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a segment that is missing, too small, or not a file is refused with a clear error', () => {
  const dir = freshShmDir();
  try {
    writeFileSync(`${dir}/small`, Buffer.alloc(100), { mode: 0o600 });
    assert.throws(() => addon().mapShared(`${dir}/missing`, 4096), /cannot open shared segment .*missing/);
    assert.throws(() => addon().mapShared(`${dir}/small`, 4096), /is not a segment of 4096 bytes/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
