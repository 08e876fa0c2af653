// Segments a killed daemon left behind are removed by the next one; nothing else is.
import { existsSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { pidNamespaceId, sweepStaleSegments } from '../../src/native/sweepStaleSegments.js';
import { freshShmDir } from '../helpers/paths.js';

const deadPid = 2 ** 22 + 777; // above pid_max: never a live process

test('removes only this namespace\'s segments of dead daemons', () => {
  const dir = freshShmDir();
  try {
    const ns = pidNamespaceId();
    assert.match(ns, /^[1-9]\d*$/, 'the pid namespace is known here');
    const files = {
      dead: `weightd-${deadPid}-${ns}-host-a-0-0123456789abcdef-s0`,
      otherNamespace: `weightd-${deadPid}-${Number(ns) + 1}-host-a-0-0123456789abcdef-s0`,
      alive: `weightd-${process.pid}-${ns}-host-a-0-0123456789abcdef-s0`,
      unrelated: `weightd-notes.txt`,
    };
    for (const f of Object.values(files)) writeFileSync(`${dir}/${f}`, 'x');
    assert.equal(sweepStaleSegments(dir), [`${dir}/${files.dead}`]);
    assert.equal(readdirSync(dir).sort(), [files.alive, files.otherNamespace, files.unrelated].sort());
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the addon names its segments so that the sweep recognises them, and keeps a live one', async () => {
  const dir = freshShmDir();
  const device = new DeviceHandle('host', 0, { uuid: 'host-sweep-0', shmDir: dir });
  try {
    await device.allocate([4096]);
    const [segment] = device.exportSegments();
    assert.match(segment!.handle, new RegExp(`/weightd-${process.pid}-${pidNamespaceId()}-host-sweep-0-[0-9a-f]{16}-s0$`));
    assert.equal(sweepStaleSegments(dir), [], 'this process is alive');
    assert.ok(existsSync(segment!.handle));
  } finally {
    await device.free();
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
