// The fill options a node's ranks get: several GPUs share one pass over the files; a cuda load
// of files the page cache mostly lacks reads them with O_DIRECT; host devices fill alone,
// through the cache, several sharing only the digests' hashing. And the page-cache share itself, measured on a real file.
import { execFileSync } from 'node:child_process';
import { closeSync, fsyncSync, mkdirSync, mkdtempSync, openSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DeviceError, UsageError } from '../../src/errors.js';
import { addon } from '../../src/native/addon.js';
import { cachedShare, type DeviceSlot } from '../../src/native/devices.js';
import { nodeFillOptions } from '../../src/native/fillPolicy.js';
import { repoRoot } from '../helpers/paths.js';

const gpu = (index: number): DeviceSlot => ({ backend: 'cuda', index, uuid: `GPU-${index}` });
const host = (index: number): DeviceSlot => ({ backend: 'host', index, uuid: `host-${index}` });
const warm = async () => 1;
const cold = async () => 0.1;

test('two or more GPUs get one group with a fresh id and the device count as its size', async () => {
  const a = await nodeFillOptions({ threads: 12 }, [gpu(0), gpu(1)], warm, {});
  const b = await nodeFillOptions({ threads: 12 }, [gpu(0), gpu(1)], warm, {});
  assert.is(a.threads, 12);
  assert.is(a.group?.size, 2);
  assert.match(a.group!.id, /^[0-9a-f-]{36}$/);
  assert.is.not(a.group!.id, b.group!.id, 'each load is its own group');
  assert.is(a.direct, undefined, 'a warm cache is read through the cache');
});

test('one warm GPU fills alone, hashing on the GPU; host devices (warm or cold) keep their options, and several share a digest group', async () => {
  const options = { chunkBytes: 4 << 20 };
  assert.equal(await nodeFillOptions(options, [gpu(0)], warm, {}), { ...options, digestOn: 'gpu' });
  let asked = false;
  const two = await nodeFillOptions(options, [host(0), host(1)], async () => ((asked = true), 0), {});
  assert.equal({ ...two, group: undefined }, { ...options, group: undefined });
  assert.is(two.group?.size, 2);
  assert.match(two.group!.id, /^[0-9a-f-]{36}$/);
  assert.is.not(two.group!.id, (await nodeFillOptions(options, [host(0), host(1)], warm, {})).group!.id, 'each load is its own group');
  assert.equal(await nodeFillOptions(options, [host(0)], cold, {}), options, 'one host device fills alone');
  assert.not.ok(asked, 'the page cache is not even looked at for host devices');
});

test('a cold cuda load reads with O_DIRECT in 8 MiB chunks, unless the options say otherwise', async () => {
  assert.equal(await nodeFillOptions({}, [gpu(0)], cold, {}), { direct: true, chunkBytes: 8 << 20, stagingBytes: 128 << 20, digestOn: 'gpu' });
  const two = await nodeFillOptions({ threads: 4, chunkBytes: 4 << 20 }, [gpu(0), gpu(1)], cold, {});
  assert.equal({ ...two, group: undefined }, { direct: true, chunkBytes: 4 << 20, stagingBytes: 128 << 20, threads: 4, group: undefined, digestOn: 'gpu' });
  assert.is(two.group?.size, 2);
  let asked = false;
  assert.equal(await nodeFillOptions({ direct: false }, [gpu(0)], async () => ((asked = true), 0), {}), { direct: false, digestOn: 'gpu' });
  assert.not.ok(asked, 'an explicit choice is not second-guessed');
});

test('cuda fills hash their digests on the GPU unless WEIGHTD_FILL_DIGESTS_ON=cpu asks for the CPU, and an explicit digestOn stands', async () => {
  const on = (value?: string) => (value === undefined ? {} : { WEIGHTD_FILL_DIGESTS_ON: value });
  assert.is((await nodeFillOptions({}, [gpu(0)], warm, on())).digestOn, 'gpu');
  assert.is((await nodeFillOptions({}, [gpu(0)], warm, on(''))).digestOn, 'gpu');
  assert.is((await nodeFillOptions({}, [gpu(0)], warm, on('cpu'))).digestOn, 'cpu');
  assert.is((await nodeFillOptions({}, [gpu(0)], warm, on('gpu'))).digestOn, 'gpu');
  assert.is((await nodeFillOptions({ digestOn: 'cpu' }, [gpu(0)], warm, on('gpu'))).digestOn, 'cpu');
  assert.is((await nodeFillOptions({}, [host(0)], warm, on('gpu'))).digestOn, undefined, 'host fills have no GPU to ask');
  // The build's WEIGHTD_GPU_DIGESTS (a CMake option) is not the runtime switch.
  assert.is((await nodeFillOptions({}, [gpu(0)], warm, { WEIGHTD_GPU_DIGESTS: '1' })).digestOn, 'gpu');
});

test('WEIGHTD_FILL_DIGESTS_ON other than gpu or cpu is refused, naming the value and the allowed ones', async () => {
  for (const value of ['1', 'true', 'yes', 'GPU', '0']) {
    const refused = await nodeFillOptions({}, [gpu(0)], warm, { WEIGHTD_FILL_DIGESTS_ON: value }).then(() => undefined, (e: unknown) => e);
    assert.instance(refused, UsageError, value);
    assert.is((refused as UsageError).code, 'E_USAGE');
    assert.is((refused as Error).message, `WEIGHTD_FILL_DIGESTS_ON=${JSON.stringify(value)}: must be gpu or cpu; unset it to hash on the GPU where the digest kernel is built`);
  }
});

test('cachedShare sees a freshly written file in the cache, and out of it once dropped', async () => {
  // On the repository's disk: tmpfs pages are always resident.
  mkdirSync(join(repoRoot, 'test', 'artifacts'), { recursive: true });
  const dir = mkdtempSync(join(repoRoot, 'test', 'artifacts', 'cache-'));
  try {
    const path = join(dir, 'weights.bin');
    writeFileSync(path, randomBytes(8 << 20));
    const fd = openSync(path, 'r');
    fsyncSync(fd); // dirty pages cannot be dropped
    closeSync(fd);
    const written = await cachedShare([path]);
    assert.ok(written > 0.9, `just written: ${written}`);
    // dd's nocache flag asks the kernel to drop the file's clean pages (posix_fadvise DONTNEED).
    execFileSync('dd', [`if=${path}`, 'iflag=nocache', 'count=0', 'status=none']);
    const dropped = await cachedShare([path]);
    assert.ok(dropped < 0.1, `dropped: ${dropped}`);
    assert.is(await cachedShare([]), 1, 'no bytes: nothing to read cold');
    const missing = await cachedShare([join(dir, 'missing.bin')]).then(() => undefined, (e: unknown) => e);
    assert.instance(missing, DeviceError);
    assert.is((missing as DeviceError).code, 'E_FILE_OPEN');
    assert.match((missing as Error).message, /missing\.bin/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the residency scan samples a 1 MiB window of every 64 MiB of a large file, and all of a small one', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-residency-'));
  try {
    const large = join(dir, 'large.bin');
    const small = join(dir, 'small.bin');
    writeFileSync(large, '');
    truncateSync(large, 256 * 2 ** 20 + 12345); // sparse: nothing to write or read
    writeFileSync(small, randomBytes(100_000));
    const r = await addon().pageCacheResidency([large, small]);
    assert.is(r.totalBytes, 256 * 2 ** 20 + 12345 + 100_000);
    // 4 whole strides and a 12345-byte tail, each with one window; the small file whole.
    assert.is(r.sampledBytes, 4 * 2 ** 20 + 12345 + 100_000);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
