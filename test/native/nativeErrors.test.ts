// Native failures arrive as weightd's DeviceError, made by the addon itself (one factory,
// native/addon.cpp makeError), with the C++ code: thrown by a synchronous call, rejected by an
// asynchronous one (with the caller's stack), reported by a fill. The codes the C++ raises are the
// codes src/errors.ts lists, and a code it does not list does not compile.
import { closeSync, openSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DeviceError, NATIVE_ERROR_CODES } from '../../src/errors.js';
import { addon } from '../../src/native/addon.js';
import { fillSizing } from '../../src/native/fillPolicy.js';
import { packCopyOps, packZeroRanges } from '../../src/native/fillRecords.js';
import { freshTempDir, repoRoot } from '../helpers/paths.js';

test('a synchronous call throws a DeviceError with the C++ code', () => {
  const notSegment = openSync('/dev/null', 'r');
  try {
    addon().mapShared(notSegment, 4096);
    assert.unreachable('a descriptor that is no segment was mapped');
  } catch (err) {
    assert.instance(err, DeviceError);
    assert.is((err as DeviceError).code, 'E_SHM_OPEN');
    assert.is((err as DeviceError).name, 'DeviceError');
  } finally {
    closeSync(notSegment);
  }
});

test('an asynchronous call rejects with a DeviceError whose stack names the caller', async function residencyOfAMissingFile() {
  const err = await addon().pageCacheResidency(['/nonexistent-weightd-file']).then(() => undefined, (e: unknown) => e);
  assert.instance(err, DeviceError);
  assert.is((err as DeviceError).code, 'E_FILE_OPEN');
  assert.match((err as Error).stack!, /^DeviceError: cannot open/);
  assert.match((err as Error).stack!, /nativeErrors\.test\.js/);
});

test("a fill's failure is a DeviceError", async () => {
  const dir = freshTempDir();
  const device = new (addon().Device)('host', 0, { uuid: `errors-${process.pid}` });
  try {
    await device.allocate([4096]);
    device.startFill([join(dir, 'missing')], packCopyOps([{ file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: 16, srcPitch: 0 }]), packZeroRanges([]), fillSizing({}));
    let status = device.fillStatus();
    while (!status.done) {
      await new Promise(setImmediate);
      status = device.fillStatus();
    }
    assert.instance(status.error, DeviceError);
    assert.is(status.error!.code, 'E_FILE_OPEN');
  } finally {
    await device.free();
  }
});

test('NATIVE_ERROR_CODES lists exactly the codes the C++ source raises', () => {
  const dir = join(repoRoot, 'native');
  const inSource = new Set<string>();
  // native/keeper/ is another program, with its own wire codes: only the addon's files count.
  for (const name of readdirSync(dir).filter((n) => /\.(cpp|h)$/.test(n))) {
    for (const m of readFileSync(join(dir, name), 'utf8').matchAll(/"(E_[A-Z0-9_]+)"/g)) inSource.add(m[1]!);
  }
  assert.equal([...inSource].sort(), [...NATIVE_ERROR_CODES].sort());
});

test('a code that is not listed does not compile', () => {
  // @ts-expect-error: E_NO_SUCH_CODE is not an ErrorCode (the build fails if this line compiles)
  const err = new DeviceError('E_NO_SUCH_CODE', 'a typo');
  assert.is(err.code, 'E_NO_SUCH_CODE');
});

test.run();
