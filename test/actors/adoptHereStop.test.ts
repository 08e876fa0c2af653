// A STOP that comes while a host rank asks the keeper on the main thread (src/actors/adoptHere.ts,
// a restart's fast path): the rank stops once the keeper answers, and when nothing was adopted
// no worker thread starts for a rank that was told to stop. The keeper here is a socket that
// holds the request until the test ends the connection (a keeper that failed: nothing adopted).
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { assign, createActor, setup, type AnyActorRef } from 'xstate';
import { rankActor } from '../../src/actors/rankActor.js';
import type { RankActorInput, RankEvent } from '../../src/models/rankContract.js';
import type { RankWorkerData } from '../../src/models/rankMessages.js';
import type { WorkerRegistry } from '../../src/models/workerRegistry.js';

/** A worker module that stops when told: only started (and so counted) if the rank actor starts one. */
const STOPPING_WORKER = new URL(
  `data:text/javascript,${encodeURIComponent("import { parentPort } from 'node:worker_threads'; parentPort.on('message', (m) => { if (m.type === 'STOP') parentPort.close(); });")}`,
);

for (const command of ['RANK_STOP', 'RANK_RELEASE then RANK_STOP'] as const) {
  test(`a ${command} while the main thread asks the keeper: the rank stops, and no worker thread starts`, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'weightd-adopthere-'));
    const socket = join(dir, 'keeper.sock');
    let asked!: (s: Socket) => void;
    const request = new Promise<Socket>((resolve) => (asked = resolve));
    const keeper = createServer((s) => asked(s));
    await new Promise<void>((resolve) => keeper.listen(socket, resolve));
    const started: unknown[] = [];
    const input: RankActorInput = {
      worker: STOPPING_WORKER,
      workerData: {
        nodeRank: 0,
        localRank: 0,
        globalRank: 0,
        device: { backend: 'host', index: 0, uuid: `adopthere-${process.pid}` },
        plan: { fingerprint: 'f'.repeat(64), segments: [4096], totalBytes: 4096 },
        keeper: { socket, model: 'm', writer: 'test' },
      } as unknown as RankWorkerData,
      log: pino({ level: 'silent' }),
      workers: {
        start: (module: URL, data: RankWorkerData) => {
          const worker = new Worker(module, { workerData: data });
          started.push(worker);
          return { worker, warm: false };
        },
      } as unknown as WorkerRegistry,
    };
    let stopped!: () => void;
    const rankStopped = new Promise<void>((resolve) => (stopped = resolve));
    const parent = createActor(
      setup({ actors: { rank: rankActor }, types: { context: {} as { events: string[] } } }).createMachine({
        context: { events: [] },
        invoke: { id: 'rank', src: 'rank', input: () => input },
        on: {
          '*': {
            actions: [
              assign({ events: ({ context, event }) => [...context.events, event.type] }),
              ({ event }) => void ((event as RankEvent).type === 'RANK_STOPPED' && stopped()),
            ],
          },
        },
      }),
    );
    parent.start();
    try {
      const conn = await request;
      const rank = parent.getSnapshot().children.rank as AnyActorRef;
      if (command !== 'RANK_STOP') rank.send({ type: 'RANK_RELEASE' });
      rank.send({ type: 'RANK_STOP' });
      // The keeper fails: nothing to adopt.
      conn.destroy();
      await rankStopped;
      assert.is(started.length, 0, 'no worker thread starts for a rank told to stop');
      assert.equal(parent.getSnapshot().context.events.filter((e) => e !== 'RANK_RELEASED'), ['RANK_STOPPED']);
    } finally {
      parent.stop();
      keeper.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

test.run();
