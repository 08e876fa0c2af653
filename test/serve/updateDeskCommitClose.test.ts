// A writer's connection that closes while its commit is digested (host) or copied (cuda) on the
// addon's threads ends the update, but the part's descriptors are the commit's until it settles:
// the threads name them by number (/proc/self/fd/N paths, or descriptors a VMM import opens), so
// one closed under them may be any other file by the time a thread opens it. They are closed
// once the commit settles (on the addon's threads: UpdateDesk.closed), and none is left.
import { closeSync, openSync, readlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { ServeError } from '../../src/errors.js';
import type { RankService } from '../../src/serve/rankService.js';
import { UpdateDesk } from '../../src/serve/updateDesk.js';
import { openFdCount } from '../helpers/memfds.js';
import { freshTempDir } from '../helpers/paths.js';

const BYTES = 1 << 16;
const quiet = { info() {}, warn() {}, debug() {}, error() {} };

/** A host rank of one segment (a plain file standing in for its memfd) holding one tensor. */
function hostRank(fd: number): RankService {
  const rank = {
    name: 'm',
    backend: 'host',
    nnodes: 1,
    globalRank: 0,
    localRank: 0,
    fingerprint: 'f'.repeat(64),
    fingerprintFields: {},
    segments: [{ segment: 0, fd, bytes: BYTES, handle: 'memfd' }],
    tensors: [{ name: 't', dtype: 'U8', shape: [BYTES], segment: 0, offset: 0, bytes: BYTES }],
  };
  return { rank, log: quiet, refuseUnlessServing() {}, holdSegmentFds: () => () => {} } as unknown as RankService;
}

test('a connection closing during commit leaves the part\'s descriptors open until the commit settles, then closes every one', async () => {
  const file = join(freshTempDir(), 'base');
  writeFileSync(file, Buffer.alloc(BYTES, 7));
  const base = openSync(file, 'r');
  try {
    const before = openFdCount();
    const desk = new UpdateDesk();
    desk.publisher = () => assert.unreachable('an ended update is not published') as never;
    const caller = { pid: process.pid, connectionId: 1 };
    const begun = await desk.begin(hostRank(base), 'v1', [0], caller, () => true);
    begun.sent();
    const [copy] = begun.fds;
    const target = readlinkSync(`/proc/self/fd/${copy}`);
    // Not awaited: its digests are on the addon's threads now, reading /proc/self/fd/<copy>.
    const committing = desk.commit(begun.id, caller).then(
      () => assert.unreachable('a commit whose update ended resolved') as never,
      (e: ServeError) => e,
    );
    desk.connectionClosed(caller.connectionId);
    // Every reaction the end queued runs before this await resumes; the commit cannot have settled
    // (its threads answer on a later turn of the event loop).
    await Promise.resolve();
    assert.is(readlinkSync(`/proc/self/fd/${copy}`), target, 'the copy the commit reads is still open');
    const err = await committing;
    assert.is(err.code, 'E_UPDATE_ABORTED');
    // The commit's settling hands the descriptors to the addon's threads to close (off the main
    // thread: the last one of a version's memory frees it); closed() settles once they are.
    await desk.closed();
    assert.is(openFdCount(), before, 'every descriptor of the update is closed once the commit settled');
  } finally {
    closeSync(base);
  }
});

test.run();
