// The daemon closes idle connections; clients carry on: a map lease outlives the connection and
// is detached over a new one, while a connection holding a copy lease is never closed as idle
// (closing it would end the lease mid-copy).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel } from '../helpers/paths.js';

const IDLE_MS = 300;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

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
    await sleep(IDLE_MS * 3); // the daemon has closed our connection meanwhile
    assert.is(Object.values(attached.tensors)[0]!.data[0], sample, 'the mapping outlives the connection');
    assert.is((await client.stats()).leases.length, 1, 'reconnected; the map lease is still there');
    await attached.detach();
    assert.is((await client.stats()).leases.length, 0);

    const copier = await WeightdClient.connect(socket);
    const state = await copier.getState(expected, 'copy');
    assert.is(state.status, 'ok');
    await sleep(IDLE_MS * 3);
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
