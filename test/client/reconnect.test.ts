// The daemon closes idle connections; clients carry on: a map lease outlives the connection and
// is detached over a new one, while a connection holding a copy lease is never closed as idle
// (closing it would end the lease mid-copy).
//
// "The daemon has idle-closed our connection" is an event the client does not expose, so the
// test waits for a probe: a bare connection opened after our last reply, which the daemon
// idle-closes in turn. Its idle timer was armed after ours with the same timeout, and Node runs
// such timers in the order they were armed: once the probe is closed, ours has fired.
import { createConnection } from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel } from '../helpers/paths.js';

const IDLE_MS = 300;

/** Resolves once the daemon has idle-closed a connection opened now, and so every connection idle since before. */
function idleTimeoutsFired(socketPath: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const probe = createConnection(socketPath);
    probe.on('error', reject);
    probe.on('close', () => resolve());
    probe.resume();
  });
}

test('idle close, transparent reconnect, detach over a new connection; copy leases keep theirs', async () => {
  const dir = makeTempDir('idle');
  const daemon = await startDaemon({ model: exampleModel, socketDir: dir, env: { WEIGHTD_SERVE_IDLE_TIMEOUT_MS: String(IDLE_MS) } });
  try {
    const socket = await findSocket({ socketDir: dir, globalRank: 0 });
    const expected = await expectedFingerprint(exampleModel, 1, 0);
    const client = await WeightdClient.connect(socket);
    const attached = await client.attach(expected);
    if (attached.status !== 'attached' || attached.backend !== 'host') throw new Error('attach failed');
    const sample = Object.values(attached.tensors)[0]!.data[0];
    await idleTimeoutsFired(socket); // the daemon has closed our connection meanwhile
    assert.is(Object.values(attached.tensors)[0]!.data[0], sample, 'the mapping outlives the connection');
    assert.is((await client.stats()).leases.length, 1, 'reconnected; the map lease is still there');
    await attached.detach();
    assert.is((await client.stats()).leases.length, 0);

    const copier = await WeightdClient.connect(socket);
    const state = await copier.getState(expected, 'copy');
    assert.is(state.status, 'ok');
    await idleTimeoutsFired(socket);
    const leases = (await client.stats()).leases;
    assert.is(leases.length, 1, 'the copy lease survived the idle time: its connection was kept');
    assert.is(await copier.detach(), 1, 'detached on the same connection');
    copier.close();
    client.close();
  } finally {
    await daemon.stop();
    removeDir(dir);
  }
});

test.run();
