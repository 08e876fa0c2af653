// KEEP, TAKE, DROP, LIST and PING against the real weightd-keeper: what is taken is what was
// kept (the same blob, fds of the same memfd), a fingerprint that was not kept is E_NOT_KEPT
// naming those that were, and the keeper holds exactly the fds of its records.
import { closeSync, fstatSync, readSync, writeSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { KeeperError } from '../../src/errors.js';
import { addon } from '../../src/native/addon.js';
import { fdKinds, memfdWith, startTestKeeper, waitUntil, type TestKeeper } from '../helpers/keeper.js';

let keeper: TestKeeper;
let idle: ReturnType<typeof fdKinds>;

test.before.each(async () => {
  keeper = await startTestKeeper();
  idle = fdKinds(keeper.pid);
});

test.after.each(async () => {
  await keeper.kill();
});

function readAll(fd: number, bytes: number): Buffer {
  const b = Buffer.alloc(bytes);
  readSync(fd, b, 0, bytes, 0);
  return b;
}

/**
 * Waits until the keeper holds exactly `memfds` memfd descriptors, has closed every finished
 * request's connection, and watches one owner (this process, by pidfd) while it holds any.
 */
async function keeperHolds(memfds: number): Promise<void> {
  const want = { ...idle, memfd: memfds, pidfd: memfds > 0 ? 1 : 0 };
  let have = {};
  await waitUntil(() => `the keeper's fds are ${JSON.stringify(want)} (last seen: ${JSON.stringify(have)})`, () => JSON.stringify((have = fdKinds(keeper.pid))) === JSON.stringify(want));
}

test('take returns the kept blob and fds of the same memfd: a byte written through one is read through the other', async () => {
  const memfd = await memfdWith(Buffer.from('0123456789abcdef'));
  const blob = Buffer.from(Array.from({ length: 70_000 }, (_, i) => i % 251));
  try {
    await keeper.client.keep('host-0', 'fp-a', blob, [memfd]);
    await keeperHolds(1);
    const taken = await keeper.client.take('host-0', 'fp-a');
    try {
      assert.equal(taken.record, blob);
      assert.is(taken.fds.length, 1);
      assert.ok(taken.ageMs >= 0);
      assert.is(fstatSync(taken.fds[0]!).ino, fstatSync(memfd).ino, 'the same file');
      writeSync(memfd, Buffer.from('PATTERN'), 0, 7, 3);
      assert.is(readAll(taken.fds[0]!, 16).toString(), '012PATTERNabcdef');
    } finally {
      for (const fd of taken.fds) addon().closeFd(fd);
    }
    // The keeper's own fd stays: a take hands out dups.
    await keeperHolds(1);
    assert.is((await keeper.client.ping()).fds, 1);
  } finally {
    closeSync(memfd);
  }
});

test('300 fds (two batches each way) are kept and taken in order', async () => {
  const memfds = await Promise.all(Array.from({ length: 3 }, (_, i) => memfdWith(Buffer.from(`file ${i}`))));
  const fds = Array.from({ length: 300 }, (_, i) => memfds[i % 3]!);
  try {
    await keeper.client.keep('host-0', 'fp-many', Buffer.from('{}'), fds);
    await keeperHolds(300);
    const taken = await keeper.client.take('host-0', 'fp-many');
    assert.is(taken.fds.length, 300);
    taken.fds.forEach((fd, i) => assert.is(readAll(fd, 6).toString(), `file ${i % 3}`, `fd ${i}`));
    for (const fd of taken.fds) addon().closeFd(fd);
  } finally {
    for (const fd of memfds) closeSync(fd);
  }
});

test('take of a fingerprint that is not kept: E_NOT_KEPT naming the fingerprints kept for the device', async () => {
  const memfd = await memfdWith(Buffer.from('x'));
  try {
    await keeper.client.keep('host-0', 'fp-a', Buffer.from('a'), [memfd]);
    await keeper.client.keep('host-0', 'fp-b', Buffer.from('b'), [memfd]);
    const err = await keeper.client.take('host-0', 'fp-c').then(() => undefined, (e: unknown) => e);
    assert.instance(err, KeeperError);
    assert.is((err as KeeperError).code, 'E_NOT_KEPT');
    assert.match((err as Error).message, /no record of fingerprint fp-c for device host-0; kept for it: fp-a, fp-b/);
    const none = await keeper.client.take('host-9', 'fp-a').then(() => undefined, (e: unknown) => e);
    assert.match((none as Error).message, /nothing is kept for that device/);
    // An E_NOT_KEPT is an answer, not bad input: the keeper still holds both records.
    assert.is((await keeper.client.list()).length, 2);
  } finally {
    closeSync(memfd);
  }
});

test('keep of the same key replaces the record and closes its old fds', async () => {
  const memfd = await memfdWith(Buffer.from('x'));
  try {
    await keeper.client.keep('host-0', 'fp-a', Buffer.from('old'), [memfd, memfd, memfd]);
    await keeperHolds(3);
    await keeper.client.keep('host-0', 'fp-a', Buffer.from('new'), [memfd]);
    await keeperHolds(1);
    const taken = await keeper.client.take('host-0', 'fp-a');
    assert.is(taken.record.toString(), 'new');
    for (const fd of taken.fds) addon().closeFd(fd);
  } finally {
    closeSync(memfd);
  }
});

test('drop by fingerprint, by device and all, each closing the dropped fds', async () => {
  const memfd = await memfdWith(Buffer.from('x'));
  try {
    for (const [device, fp] of [['host-0', 'a'], ['host-0', 'b'], ['host-1', 'a'], ['host-2', 'a']] as const) {
      await keeper.client.keep(device, fp, Buffer.from(fp), [memfd]);
    }
    await keeperHolds(4);
    assert.is(await keeper.client.drop('host-0', 'a'), 1);
    assert.is(await keeper.client.drop('host-0', 'a'), 0);
    await keeperHolds(3);
    assert.is(await keeper.client.drop('host-0'), 1);
    await keeperHolds(2);
    assert.equal((await keeper.client.list()).map((r) => r.device), ['host-1', 'host-2']);
    assert.is(await keeper.client.drop(''), 2);
    await keeperHolds(0);
    assert.equal(await keeper.client.list(), []);
  } finally {
    closeSync(memfd);
  }
});

test('list reports each record: fds, age, its live owner (this process) and no expiry; ping counts them', async () => {
  const memfd = await memfdWith(Buffer.from('x'));
  try {
    await keeper.client.keep('host-0', 'fp-a', Buffer.from('{"segments":2}'), [memfd, memfd]);
    const [r, ...rest] = await keeper.client.list();
    assert.equal(rest, []);
    assert.equal({ ...r!, ageMs: 0 }, {
      device: 'host-0', fingerprint: 'fp-a', fdCount: 2, ageMs: 0, ownerPid: process.pid, ownerAlive: true, expiresInMs: 0, record: Buffer.from('{"segments":2}'),
    });
    assert.ok(r!.ageMs >= 0 && r!.ageMs < 60_000, `age ${r!.ageMs} ms`);
    const ping = await keeper.client.ping();
    assert.equal({ ...ping, uptimeMs: 0 }, { pid: keeper.pid, protocolVersion: 1, records: 1, fds: 2, uptimeMs: 0 });
  } finally {
    closeSync(memfd);
  }
});

test.run();
