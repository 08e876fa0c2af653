// Watch notifications (docs/protocol.md, Events): a client watching a model name hears, on its
// connection, that a newer version is ready and that its version is about to be dropped (with
// the version to move to); a forced unload tells each lease holder its lease was revoked.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, WeightdClient, type ModelEvent } from '../../src/client/index.js';
import { ServeError } from '../../src/errors.js';
import { startNode, type WeightdNode } from '../../src/index.js';
import { leaseHash } from '../../src/serve/leaseTable.js';
import { weightdMemfds } from '../helpers/memfds.js';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';

/** Resolves once the node's own model's memory is freed (its ranks report it in their own time). */
function released(node: WeightdNode): Promise<void> {
  return new Promise((resolve) => {
    const check = () => node.status().models[0]!.state === 'released' && (off(), resolve());
    const off = node.onEvent(check);
    check();
  });
}

/** Resolves with the first `n` events the client hears. */
function nextEvents(client: WeightdClient, n: number): Promise<ModelEvent[]> {
  const got: ModelEvent[] = [];
  return new Promise((resolve) => {
    const off = client.onEvent((e) => {
      got.push(e);
      if (got.length === n) {
        off();
        resolve(got);
      }
    });
  });
}

test('a watcher hears model_ready for the new version, then model_dropping for its own, on its connection', async () => {
  const v2 = writeVariant(exampleModel, `${freshTempDir()}/v2`);
  const node = await startNode({ model: exampleModel, device: 'host', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    const watcher = await WeightdClient.connect(socket);
    const [v1fp, v2fp] = [(await expectedFingerprint(exampleModel, 1, 0)).fingerprint, (await expectedFingerprint(v2, 1, 0)).fingerprint];
    const watching = await watcher.watch('tiny-llama');
    assert.equal(watching.watching, ['tiny-llama']);
    assert.equal(watching.versions.map((v) => [v.fingerprint, v.status]), [[v1fp, 'serving']]);
    const unwatched = await WeightdClient.connect(socket);
    let heardByOthers = 0;
    unwatched.onEvent(() => heardByOthers++);
    await unwatched.ping();

    const heard = nextEvents(watcher, 2);
    await node.load({ model: v2, name: 'tiny-llama' });
    assert.equal(await heard, [
      { id: null, ok: true, event: 'model_ready', model: 'tiny-llama', fingerprint: v2fp, version: 0 },
      { id: null, ok: true, event: 'model_dropping', model: 'tiny-llama', fingerprint: v1fp, version: 0, newer: v2fp },
    ]);
    await released(node);
    // The connection still serves requests after the events.
    assert.equal((await watcher.ping()).models?.map((m) => [m.fingerprint, m.status]), [[v1fp, 'released'], [v2fp, 'serving']]);
    assert.is((await unwatched.ping()).fingerprint, v2fp, 'a ping that names no version is about the version that serves');
    assert.is(heardByOthers, 0, 'a connection that does not watch hears nothing');
    const tooMany = await Promise.all(Array.from({ length: 16 }, (_, i) => watcher.watch(`m${i}`))).catch((e: ServeError) => e);
    assert.instance(tooMany, ServeError);
    assert.is((tooMany as ServeError).code, 'E_TOO_MANY_WATCHES');
    watcher.close();
    unwatched.close();
  } finally {
    await node.stop();
  }
});

test('a forced unload revokes the leases and tells each holder on its connection; the memory goes at once', async () => {
  const node = await startNode({ model: exampleModel, device: 'host', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    const holder = await WeightdClient.connect(socket);
    const attached = await holder.attach(await expectedFingerprint(exampleModel, 1, 0));
    assert.is(attached.status, 'attached');
    if (attached.status !== 'attached') return;
    const heard = nextEvents(holder, 1);
    const refused = await node.unload('tiny-llama').then(() => node.status().models[0]!.state);
    assert.is(refused, 'draining', 'without force the held version drains');
    const forced = await node.unload('tiny-llama', { force: true });
    assert.equal(forced.unloaded.map((u) => [u.name, u.leases]), [['tiny-llama', 1]]);
    const [event] = await heard;
    assert.equal(event, { id: null, ok: true, event: 'lease_revoked', model: 'tiny-llama', fingerprint: attached.state.fingerprint, leaseHash: leaseHash(attached.leaseId) });
    assert.is(await attached.detach(), 0, 'the lease had ended under the holder, as it was told');
    await released(node);
    assert.equal(weightdMemfds(), []);
    holder.close();
  } finally {
    await node.stop();
  }
});

test.run();
