// A version withdrawn from its socket (a node stop, or binding failed) takes its published
// layouts with it, but a get_processed reply may still be sending their descriptors: the sender
// names them by number, so one closed under it may be another file by the time it is sent, and
// the client would map that file as the layout (rankService.holdSegmentFds). They are closed
// once the sends in flight settle, as release() does.
import { openSync, readlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { RankService } from '../../src/serve/rankService.js';
import { ServerRegistry } from '../../src/serve/serverRegistry.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { exampleModel, freshTempDir } from '../helpers/paths.js';
import { loadServedRank } from './servedRankFixture.js';

const log = pino({ level: 'silent' });

test('a withdrawn version closes its processed layouts only once the get_processed replies on their way are sent', async () => {
  const dir = makeTempDir('withdraw-processed');
  const loaded = await loadServedRank(exampleModel, { uuid: `withdraw-processed-${process.pid}` });
  const service = new RankService({ rank: loaded.served, log, freeMemory: () => loaded.device.free() });
  const registry = new ServerRegistry();
  try {
    await registry.serve(service, { version: 'v1', socketDir: dir, log });
    const file = join(freshTempDir(), 'layout');
    writeFileSync(file, Buffer.alloc(64, 3));
    const fd = openSync(file, 'r');
    const target = readlinkSync(`/proc/self/fd/${fd}`);
    assert.ok(service.processed.add({ key: 'k', keyFields: {}, tensors: [], segments: [{ segment: 0, bytes: 64, fd, handle: 'memfd' }], digests: [], bytes: 64, publishedAt: Date.now() }));
    // What get_processed does as it hands its reply to the connection's sender.
    const sent = service.holdSegmentFds();
    registry.withdraw(service);
    await new Promise(setImmediate);
    assert.is(readlinkSync(`/proc/self/fd/${fd}`), target, 'the layout\'s descriptor is still open while its reply is being sent');
    sent();
    await new Promise(setImmediate);
    assert.throws(() => readlinkSync(`/proc/self/fd/${fd}`), /ENOENT/, 'closed once the send settled');
    assert.ok(service.processed.closed);
  } finally {
    registry.withdraw(service);
    await loaded.device.free();
    removeDir(dir);
  }
});

test.run();
