// The serve actor inside a parent machine, as the supervisor will run it: RANK_SERVING once
// bound; a client's allowed release goes up as RANK_RELEASE_REQUESTED and is answered only after
// SERVE_RELEASED; a failing bind is RANK_FAILED; stopping removes socket and lock at once.
import { existsSync, readdirSync, readFileSync, statSync, symlinkSync, mkdirSync } from 'node:fs';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { assign, createActor, sendTo, setup } from 'xstate';
import { rankServiceActor, removeNodeManifest, writeNodeManifest } from '../../src/actors/rankServiceActor.js';
import type { RankServiceInput } from '../../src/serve/serveEvents.js';
import { expectedFingerprint, WeightdClient } from '../../src/client/index.js';
import { ServerRegistry } from '../../src/serve/serverRegistry.js';
import type { ServeEvent } from '../../src/serve/serveEvents.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { weightdMemfdBytes, weightdMemfds } from '../helpers/memfds.js';
import { exampleModel } from '../helpers/paths.js';
import { loadServedRank, type LoadedRank } from '../serve/servedRankFixture.js';

const log = pino({ level: 'silent' });

/** A parent that records what the actor sends and frees the device when asked, like the supervisor. */
function parent(input: RankServiceInput, loaded: LoadedRank) {
  const machine = setup({
    types: { context: {} as { events: ServeEvent[] }, events: {} as ServeEvent | { type: 'STOP_SERVING' } | { type: 'DEVICE_FREED' } },
    actors: { rankService: rankServiceActor },
  }).createMachine({
    context: { events: [] },
    initial: 'serving',
    states: {
      serving: {
        invoke: { id: 'serve', src: 'rankService', input },
        on: {
          STOP_SERVING: 'done',
          RANK_RELEASE_REQUESTED: {
            actions: [
              assign({ events: ({ context, event }) => [...context.events, event as ServeEvent] }),
              ({ self }) => void loaded.device.free().then(() => self.send({ type: 'DEVICE_FREED' })),
            ],
          },
          DEVICE_FREED: { actions: sendTo('serve', { type: 'SERVE_RELEASED' }) },
          '*': { actions: assign({ events: ({ context, event }) => [...context.events, event as ServeEvent] }) },
        },
      },
      done: { type: 'final' },
    },
  });
  return createActor(machine);
}

async function until<T>(fn: () => T | undefined, ms = 5000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 10));
  }
}

test('serving, release through the supervisor, synchronous cleanup', async () => {
  const dir = makeTempDir('actor');
  const loaded = await loadServedRank(exampleModel, { uuid: `actor-${process.pid}` });
  try {
    const actor = parent({ rank: loaded.served, version: 'model-0', socketDir: dir, log, servers: new ServerRegistry() }, loaded);
    actor.start();
    const serving = await until(() => actor.getSnapshot().context.events.find((e) => e.type === 'RANK_SERVING'));
    assert.equal(serving, { type: 'RANK_SERVING', localRank: 0, socketPath: `${dir}/actor-${process.pid}.sock` });
    assert.is(statSync(serving.type === 'RANK_SERVING' ? serving.socketPath : '').mode & 0o777, 0o600);
    assert.is(JSON.parse(readFileSync(`${dir}/actor-${process.pid}.lock`, 'utf8')).pid, process.pid);

    writeNodeManifest(dir, [{ globalRank: 0, localRank: 0, socketPath: `${dir}/actor-${process.pid}.sock`, deviceUuid: `actor-${process.pid}`, fingerprint: loaded.served.fingerprint }]);
    assert.is(statSync(`${dir}/node.json`).mode & 0o777, 0o600);

    const client = await WeightdClient.connect(`${dir}/actor-${process.pid}.sock`);
    const held = weightdMemfdBytes();
    const heldBefore = (await client.stats()).deviceBytes;
    const released = await client.release();
    // Asserted after the release, so that a failure still lets the actor stop and the test end.
    const heldAfter = (await client.stats()).deviceBytes;
    assert.ok(held > 0);
    assert.is(heldBefore, held, 'stats reports the bytes its segments hold');
    assert.is(heldAfter, 0, 'nothing is held once released');
    assert.is(released.alreadyReleased, false);
    assert.ok(actor.getSnapshot().context.events.some((e) => e.type === 'RANK_RELEASE_REQUESTED'));
    assert.equal(weightdMemfds(), [], 'the parent freed the segments before the client heard back');
    const fp = await expectedFingerprint(exampleModel, 1, 0);
    await client.getState(fp, 'map').then(
      () => assert.unreachable('get_state after release'),
      (err: { code: string }) => assert.is(err.code, 'E_RELEASED'),
    );
    client.close();

    actor.send({ type: 'STOP_SERVING' });
    // Cleanup ran inside send(): nothing may be left, without waiting.
    removeNodeManifest(dir);
    assert.equal(readdirSync(dir), []);
  } finally {
    await loaded.device.free();
    removeDir(dir);
  }
});

test('a bind failure is RANK_FAILED; stopping mid-start leaves nothing', async () => {
  const dir = makeTempDir('actorfail');
  const loaded = await loadServedRank(exampleModel, { uuid: `fail-${process.pid}` });
  try {
    mkdirSync(`${dir}/real`, { mode: 0o700 });
    symlinkSync(`${dir}/real`, `${dir}/link`);
    const failing = parent({ rank: loaded.served, version: 'model-0', socketDir: `${dir}/link`, log, servers: new ServerRegistry() }, loaded);
    failing.start();
    const failed = await until(() => failing.getSnapshot().context.events.find((e) => e.type === 'RANK_FAILED'));
    assert.is(failed.type === 'RANK_FAILED' && failed.error.code, 'E_SOCKET_DIR_SYMLINK');
    failing.stop();

    // Stop before the (asynchronous) start finishes: whatever it took must be let go.
    const early = parent({ rank: loaded.served, version: 'model-0', socketDir: `${dir}/real`, log, servers: new ServerRegistry() }, loaded);
    early.start();
    early.stop();
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(readdirSync(`${dir}/real`), []);
    assert.not.ok(existsSync(`${dir}/real/fail-${process.pid}.sock`));
  } finally {
    await loaded.device.free();
    removeDir(dir);
  }
});

test.run();
