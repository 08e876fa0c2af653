// Fill sizing has one policy (src/native/fillPolicy.ts): it decides every number a fill runs
// with, and the addon, which has no defaults of its own, refuses a fill the policy did not size.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { addon } from '../../src/native/addon.js';
import { FILL_SIZING, fillSizing, nodeFillOptions } from '../../src/native/fillPolicy.js';
import { packCopyOps, packZeroRanges } from '../../src/native/fillRecords.js';

const MiB = 2 ** 20;

test('a fill left to the policy runs 8 threads over 2 MiB chunks and 32 MiB of staging; a group pins at most 512 MiB', () => {
  assert.equal(fillSizing({}), { threads: 8, chunkBytes: 2 * MiB, stagingBytes: 32 * MiB, maxGroupStagingBytes: 512 * MiB });
  assert.equal(FILL_SIZING, fillSizing({}));
});

test('the caller\'s choices stand, and an undefined one is left to the policy', () => {
  assert.equal(fillSizing({ threads: 3, chunkBytes: undefined, mode: 'register', direct: false }), {
    threads: 3, chunkBytes: 2 * MiB, stagingBytes: 32 * MiB, maxGroupStagingBytes: 512 * MiB, mode: 'register', direct: false,
  });
});

test('a cold cuda node load: O_DIRECT, 8 MiB chunks, 128 MiB of staging, the default threads', async () => {
  const { group, ...cold } = fillSizing(await nodeFillOptions({}, [{ backend: 'cuda', index: 0, uuid: 'a' }, { backend: 'cuda', index: 1, uuid: 'b' }], async () => 0, {}));
  assert.equal(cold, { threads: 8, chunkBytes: 8 * MiB, stagingBytes: 128 * MiB, maxGroupStagingBytes: 512 * MiB, direct: true, digestOn: 'gpu' });
  assert.is(group?.size, 2);
});

test('the addon decides no number: a fill without one, or with one out of bounds, is refused', async () => {
  const device = new (addon().Device)('host', 0, { uuid: `policy-${process.pid}` });
  try {
    await device.allocate([4096]);
    const start = (options: object) => device.startFill([], packCopyOps([]), packZeroRanges([]), options as ReturnType<typeof fillSizing>);
    assert.throws(() => start({}), (e: Error) => e instanceof TypeError && /options\.threads is missing: .*fillSizing/.test(e.message));
    const { chunkBytes: _, ...noChunk } = fillSizing({});
    assert.throws(() => start(noChunk), /options\.chunkBytes is missing/);
    assert.throws(() => start(fillSizing({ threads: 0 })), /threads must be from 1 to 256, got 0/);
    assert.throws(() => start(fillSizing({ threads: 257 })), /threads must be from 1 to 256, got 257/);
    assert.throws(() => start(fillSizing({ stagingBytes: 0 })), /stagingBytes must be from 1/);
    start(fillSizing({}));
  } finally {
    await device.free();
  }
});

test.run();
