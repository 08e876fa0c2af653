// node.json names the daemon by pid and start time, and findSocket trusts it only while that
// very process runs (docs/spec/liveness.md): a file whose pid now belongs to another process
// (pid reuse) is ignored, and the sockets themselves are asked instead.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { findSocket } from '../../src/client/index.js';
import { ServeError } from '../../src/errors.js';
import { nodeManifestPath, readNodeManifest, writeNodeManifest } from '../../src/wire/nodeManifest.js';
import { processIdentity } from '../../src/wire/processLiveness.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';

const self = processIdentity(process.pid);

/** A socket directory whose node.json lists rank 0 at an existing path, written by `writer`. */
function dirWithManifest(writer: { pid: number; startTime?: string }): { dir: string; socketPath: string } {
  const dir = makeTempDir('find-socket');
  const socketPath = join(dir, 'GPU-0.sock');
  writeFileSync(socketPath, '');
  const ranks = [{ globalRank: 0, localRank: 0, socketPath, deviceUuid: 'GPU-0', fingerprint: 'f'.repeat(64) }];
  writeFileSync(nodeManifestPath(dir), JSON.stringify({ version: 1, ...writer, writtenAt: new Date().toISOString(), ranks }));
  return { dir, socketPath };
}

test('the daemon writes its start time into node.json', () => {
  assert.ok(self.startTime, 'this test needs /proc');
  const dir = makeTempDir('manifest-start');
  try {
    writeNodeManifest(dir, []);
    const m = readNodeManifest(dir)!;
    assert.is(m.pid, process.pid);
    assert.is(m.startTime, self.startTime);
  } finally {
    removeDir(dir);
  }
});

test('a node.json of a live pid with its start time leads to the socket', async () => {
  const { dir, socketPath } = dirWithManifest(self);
  try {
    assert.is(await findSocket({ socketDir: dir, globalRank: 0 }), socketPath);
  } finally {
    removeDir(dir);
  }
});

test('a node.json whose pid now has another start time (a reused pid) is ignored', async () => {
  const { dir } = dirWithManifest({ pid: process.pid, startTime: `${self.startTime}1` });
  try {
    const err = await findSocket({ socketDir: dir, globalRank: 0 }).then(() => undefined, (e: unknown) => e);
    assert.instance(err, ServeError);
    assert.match((err as ServeError).message, /rank 0/);
  } finally {
    removeDir(dir);
  }
});

test.run();
