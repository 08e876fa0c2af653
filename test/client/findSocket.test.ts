// node.json names the daemon by pid and start time, and findSocket trusts it only while that
// very process runs (docs/spec/liveness.md): a file whose pid now belongs to another process
// (pid reuse) is ignored, and the sockets themselves are asked instead.
import { writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
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

test('without node.json the search asks no keeper and no control socket (docs/spec/socket-names.md)', async () => {
  const dir = makeTempDir('find-socket-names');
  const asked: string[] = [];
  const servers: Server[] = [];
  try {
    for (const name of ['keeper.sock', 'control-4242.sock', 'host-0.sock']) {
      // Each accepts and never answers: host-0 is given up on after findSocket's 2 s.
      const server = createServer((s) => asked.push(name) && s.on('error', () => {}));
      servers.push(server);
      await new Promise<void>((resolve) => server.listen(join(dir, name), resolve));
    }
    const err = await findSocket({ socketDir: dir, globalRank: 0 }).then(() => undefined, (e: unknown) => e);
    assert.instance(err, ServeError);
    assert.equal(asked, ['host-0.sock']);
  } finally {
    for (const server of servers) server.close();
    removeDir(dir);
  }
});

test.run();
