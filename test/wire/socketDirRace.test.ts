// Two daemons of one user share the default socket directory. The one that created it removes it
// when it stops, as the last thing it kept there goes; a second daemon that had resolved the
// directory just before, and takes its device lock just after, must find the directory again
// (recreated, with the same checks) instead of failing with a bare ENOENT.
import { rmdirSync, statSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { acquireDeviceLock } from '../../src/wire/deviceLock.js';
import { defaultSocketDir, lockPathFor, resolveSocketDir } from '../../src/wire/socketDir.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';

test('the directory removed between resolveSocketDir and acquireDeviceLock is made again', () => {
  const tmp = makeTempDir('dir-race');
  const saved = process.env.TMPDIR;
  process.env.TMPDIR = tmp;
  try {
    const dir = resolveSocketDir();
    assert.is(dir, defaultSocketDir());
    // What the other daemon does when it stops last: its lock gone, it removes the empty directory.
    rmdirSync(dir);
    const lock = acquireDeviceLock(dir, 'GPU-race');
    assert.is(statSync(lockPathFor(dir, 'GPU-race')).isFile(), true);
    assert.is(statSync(dir).mode & 0o777, 0o700);
    lock.unlock();
    // Made again by this process, so this process removes it too.
    assert.throws(() => statSync(dir), /ENOENT/);
  } finally {
    if (saved === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = saved;
    removeDir(tmp);
  }
});

test.run();
