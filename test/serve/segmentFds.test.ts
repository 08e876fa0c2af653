// get_segment_fds over a real Unix socket: the reply's descriptors are the rank's own sealed
// memfds (the same inodes, fresh numbers in the receiver), one per segment in the order the
// reply lists, mapping to the bytes the device holds; a refusal carries none; and the
// receiver's descriptor count is back where it was once it closes them.
import { readlinkSync, statSync } from 'node:fs';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, WeightdClient } from '../../src/client/index.js';
import { addon } from '../../src/native/addon.js';
import { encodeMessage, FrameDecoder, MAX_REQUEST_BYTES } from '../../src/wire/frameCodec.js';
import { oneRankServer, type OneRankServer } from './oneRankServer.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { waitUntil } from '../helpers/keeper.js';
import { openFdCount } from '../helpers/memfds.js';
import { exampleModel } from '../helpers/paths.js';
import { loadServedRank } from './servedRankFixture.js';

const log = pino({ level: 'silent' });

/** Waits until the server holds only the test client's own connection. */
function oneShotsClosed(server: OneRankServer): Promise<void> {
  return waitUntil(() => `the server to close the one-shot connections (${server.stats().connections} open)`, () => server.stats().connections === 1);
}

test('the fds sent are the rank\'s sealed segments, in reply order; refusals send none; nothing leaks', async () => {
  const dir = makeTempDir('segfds');
  const loaded = await loadServedRank(exampleModel, { uuid: `segfds-${process.pid}` });
  const server = oneRankServer({ rank: loaded.served, socketDir: dir, log, freeMemory: () => loaded.device.free() });
  const socketPath = await server.listen();
  const client = await WeightdClient.connect(socketPath);
  try {
    const state = await client.getState(await expectedFingerprint(exampleModel, 1, 0), 'map');
    assert.is(state.status, 'ok');
    if (state.status !== 'ok') return;
    const before = openFdCount();
    const fds = await client.segmentFds(state.leaseId);
    assert.equal([...fds.keys()], loaded.served.segments.map((s) => s.segment));
    for (const s of loaded.served.segments) {
      const fd = fds.get(s.segment)!;
      assert.is.not(fd, s.fd, 'a descriptor of its own');
      assert.is(statSync(`/proc/self/fd/${fd}`).ino, statSync(`/proc/self/fd/${s.fd}`).ino, `segment ${s.segment}: the daemon's own memfd`);
      assert.match(readlinkSync(`/proc/self/fd/${fd}`), /^\/memfd:weightd:segfds-\d+:s\d+ \(deleted\)$/);
      const view = addon().mapShared(fd, s.bytes); // refuses an unsealed one
      assert.ok(Buffer.from(view).equals(await loaded.device.read(s.segment, 0, s.bytes)), `segment ${s.segment}: the device's bytes`);
      addon().unmapShared(view);
    }
    for (const fd of fds.values()) addon().closeFd(fd);
    // The server closes its side of each one-shot request's connection when it sees the client's
    // end, in its own time (in this same process): the count is compared once it has.
    await oneShotsClosed(server);
    assert.is(openFdCount(), before, 'closing what came leaves the count as it was');

    const refused = await addon().unixRequest(socketPath, encodeMessage({ id: 1, cmd: 'get_segment_fds', leaseId: 'f'.repeat(24) }), [], 5000, 1 << 20);
    const [payload] = new FrameDecoder(MAX_REQUEST_BYTES).push(refused.frame);
    assert.is(JSON.parse(payload!.toString('utf8')).error.code, 'E_NO_LEASE');
    assert.equal(refused.fds, [], 'a refusal carries no descriptor');
    await oneShotsClosed(server);
    assert.is(openFdCount(), before);
  } finally {
    client.close();
    server.close();
    await loaded.device.free();
    removeDir(dir);
  }
});

test('get_state names each segment\'s memory; get_segment_fds { segments } sends only those, and refuses a segment the rank lacks or one named twice', async () => {
  const dir = makeTempDir('segfds-some');
  const loaded = await loadServedRank(exampleModel, { uuid: `segfds-some-${process.pid}` });
  const server = oneRankServer({ rank: loaded.served, socketDir: dir, log, freeMemory: () => loaded.device.free() });
  const socketPath = await server.listen();
  const client = await WeightdClient.connect(socketPath);
  try {
    const state = await client.getState(await expectedFingerprint(exampleModel, 1, 0), 'map');
    assert.is(state.status, 'ok');
    if (state.status !== 'ok') return;
    const served = loaded.served.segments;
    assert.equal(state.segments.map((s) => s.memory), served.map((s) => `memfd:${statSync(`/proc/self/fd/${s.fd}`).ino}`), 'a memfd segment is named by its inode');
    const ask = async (segments: number[]) => {
      const r = await addon().unixRequest(socketPath, encodeMessage({ id: 1, cmd: 'get_segment_fds', leaseId: state.leaseId, segments }), [], 5000, 1 << 20);
      const [payload] = new FrameDecoder(MAX_REQUEST_BYTES).push(r.frame);
      return { reply: JSON.parse(payload!.toString('utf8')), fds: r.fds };
    };
    const last = served.at(-1)!;
    const some = await ask([last.segment]);
    assert.equal(some.reply.segments, [last.segment]);
    assert.is(some.fds.length, 1);
    assert.is(statSync(`/proc/self/fd/${some.fds[0]}`).ino, statSync(`/proc/self/fd/${last.fd}`).ino, 'the descriptor of the segment asked for');
    for (const fd of some.fds) addon().closeFd(fd);
    const none = await ask([]);
    assert.equal([none.reply.segments, none.fds], [[], []]);
    for (const bad of [[served.length + 3], [last.segment, last.segment]]) {
      const refused = await ask(bad);
      assert.is(refused.reply.error.code, 'E_BAD_REQUEST', JSON.stringify(bad));
      assert.equal(refused.fds, [], 'a refusal carries no descriptor');
    }
  } finally {
    client.close();
    server.close();
    await loaded.device.free();
    removeDir(dir);
  }
});

test.run();
