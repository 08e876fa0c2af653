// A writer's copy of a base segment (begin_update, native/update_segments.cpp), and a fresh segment
// (begin_publish), is judged against free host memory before any page is reserved, as an arena is
// (hostMemfd.test.ts): fallocate of more than memory can give may not fail but wake the OOM
// killer, which would pick the daemon.
// (A run of this test without the check is not safe: the reservation itself would take the
// machine's memory; the refusal's wording, naming what bounds it, is what only the check gives.)
import { openSync, closeSync, readFileSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { DeviceError } from '../../src/errors.js';
import { addon } from '../../src/native/addon.js';
import { openFdCount } from '../helpers/memfds.js';
import { freshTempDir } from '../helpers/paths.js';

test('a copy larger than free memory is refused before anything is reserved, naming the bytes and the bound; no descriptor is left', async () => {
  const file = join(freshTempDir(), 'base');
  writeFileSync(file, Buffer.alloc(4096, 7));
  const source = openSync(file, 'r');
  try {
    const before = openFdCount();
    const err = await addon()
      .createWritableCopy(source, 2 ** 50, 'weightd:update:test:r0:s0')
      .then(() => assert.unreachable('a copy of 1 PiB was made') as never, (e: DeviceError) => e);
    assert.is(err.code, 'E_OUT_OF_MEMORY');
    assert.match(err.message, /cannot hold 1125899906842624 bytes in weightd:update:test:r0:s0: only \d+ bytes are free \((MemAvailable|[^)]*memory[^)]*)\)/);
    assert.is(openFdCount(), before, 'the memfd made for the copy is closed');
  } finally {
    closeSync(source);
  }
});

test('a fresh segment (begin_publish) larger than free memory is refused the same way; one that fits is zero and sealed against shrink and grow', async () => {
  const before = openFdCount();
  const err = await addon()
    .createWritableSegment(2 ** 50, 'weightd:processed:test:r0:0')
    .then(() => assert.unreachable('a segment of 1 PiB was made') as never, (e: DeviceError) => e);
  assert.is(err.code, 'E_OUT_OF_MEMORY');
  assert.match(err.message, /cannot hold 1125899906842624 bytes in weightd:processed:test:r0:0: only \d+ bytes are free/);
  assert.is(openFdCount(), before, 'the memfd made for it is closed');
  const fd = await addon().createWritableSegment(8192, 'weightd:processed:test:r0:1');
  try {
    assert.equal(readFileSync(`/proc/self/fd/${fd}`), Buffer.alloc(8192));
    assert.throws(() => truncateSync(`/proc/self/fd/${fd}`, 4096), /EPERM|Operation not permitted/);
  } finally {
    addon().closeFd(fd);
  }
});

test.run();
