// Ranks' threads started warm (src/actors/warmRankWorker.ts, src/models/workerRegistry.ts): a
// rank takes the thread that loaded its modules while the node planned, runs its own module there
// with its own data, and misses no message the main thread sent before that module listened.
// A node takes one per local rank when nothing could be adopted, none when a keeper was already
// running, and leaves no warm thread behind once ready or stopped.
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { createServer, type AddressInfo } from 'node:net';
import { threadId } from 'node:worker_threads';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { warmRankWorkerModule } from '../../src/actors/nodeActors.js';
import { startNode } from '../../src/index.js';
import type { UsageError } from '../../src/errors.js';
import type { MainToRank, RankWorkerData } from '../../src/models/rankMessages.js';
import { WorkerRegistry } from '../../src/models/workerRegistry.js';
import { KeeperClient } from '../../src/keeper/keeperClient.js';
import { capturedLog } from '../helpers/capturedLog.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { killKeeper } from '../helpers/keeper.js';
import { exampleModel, freshTempDir } from '../helpers/paths.js';

const rankThread = new URL('../../src/actors/rankThread.js', import.meta.url).href;

/**
 * A rank module that answers each message with itself, its rank and its thread. It listens only
 * after a turn of the event loop, as a module still loading its own imports would: the main
 * thread's messages come meanwhile.
 */
const ECHO_RANK = new URL(
  `data:text/javascript,${encodeURIComponent(
    `import { parentPort, threadId } from 'node:worker_threads';
import { onMainMessage, rankWorkerData } from ${JSON.stringify(rankThread)};
const { globalRank } = rankWorkerData();
await new Promise((resolve) => setImmediate(resolve));
onMainMessage((m) => parentPort.postMessage({ m, globalRank, threadId }));
parentPort.postMessage({ listening: true });`,
  )}`,
);

const rank = (localRank: number) => ({ localRank, globalRank: 10 + localRank }) as unknown as RankWorkerData;
const sent: MainToRank[] = [{ type: 'KEEP' }, { type: 'UNKEEP' }, { type: 'KEEP_AGAIN', currentSince: 7 }, { type: 'RELEASE' }];
const LAST: MainToRank = { type: 'STOP' };

test('a rank takes its warm thread, runs its own module with its own data there, and gets every message sent before that module listened, in order', async () => {
  const workers = new WorkerRegistry();
  workers.warm(warmRankWorkerModule, 2, { warm: true });
  const started = [0, 1, 2].map((localRank) => workers.start(ECHO_RANK, rank(localRank)));
  try {
    assert.equal(
      started.map((s) => s.warm),
      [true, true, false],
      'ranks 0 and 1 take the warm threads; rank 2, which has none, starts its own',
    );
    const answers = await Promise.all(
      started.map(({ worker }) => {
        const got: Array<{ m: MainToRank; globalRank: number; threadId: number }> = [];
        // Once the module listens, one more message: its answer comes after those of every
        // message that was not lost.
        const all = new Promise<typeof got>((resolve) =>
          worker.on('message', (a: (typeof got)[number] | { listening: true }) => {
            if ('listening' in a) worker.postMessage(LAST);
            else if (got.push(a) && a.m.type === LAST.type) resolve(got);
          }),
        );
        // Sent at once: a warm thread is still importing the rank's module.
        for (const m of sent) worker.postMessage(m);
        return all;
      }),
    );
    for (const [i, got] of answers.entries()) {
      assert.equal(
        got.map((a) => a.m),
        [...sent, LAST],
        `rank ${i} got every message in order`,
      );
      assert.ok(
        got.every((a) => a.globalRank === 10 + i && a.threadId === started[i]!.worker.threadId && a.threadId !== threadId),
        `rank ${i} ran with its own data on its own thread`,
      );
    }
  } finally {
    // A rank's thread ends when its rank does (rankActor terminates it): here, the test's.
    await Promise.all(started.map(({ worker }) => worker.terminate()));
    await workers.drain();
  }
  assert.is(workers.size, 0, 'every thread exited');
});

/** A rank module that says what its thread's workerData and its rank's data are. */
const DATA_RANK = new URL(
  `data:text/javascript,${encodeURIComponent(
    `import { parentPort, workerData } from 'node:worker_threads';
import { rankWorkerData } from ${JSON.stringify(rankThread)};
parentPort.postMessage({ workerData, globalRank: rankWorkerData().globalRank });`,
  )}`,
);

test('given the warm module, a rank with no warm thread starts a thread of it and hands it its rank at once; without it, a thread of its own module', async () => {
  const runs = async (workers: WorkerRegistry) => {
    const { worker, warm } = workers.start(DATA_RANK, rank(0));
    const said = await new Promise<unknown>((resolve) => worker.once('message', resolve));
    await worker.terminate();
    await workers.drain();
    return { warm, said };
  };
  assert.equal(await runs(new WorkerRegistry({ warmModule: warmRankWorkerModule })), { warm: false, said: { workerData: { warm: true }, globalRank: 10 } });
  assert.equal(await runs(new WorkerRegistry()), { warm: false, said: { workerData: rank(0), globalRank: 10 } });
});

test('warm threads no rank took are ended: by dropWarm, and by drain; none starts warm once the node drains', async () => {
  const workers = new WorkerRegistry();
  assert.is(workers.warm(warmRankWorkerModule, 2, { warm: true }), 2);
  assert.is(workers.warm(warmRankWorkerModule, 2, { warm: true }), 0, 'each local rank has one already');
  assert.is(workers.size, 2);
  workers.dropWarm();
  await workers.drain();
  assert.is(workers.size, 0);
  assert.is(workers.warm(warmRankWorkerModule, 2, { warm: true }), 0);
  assert.is(workers.size, 0, 'a node that stopped starts no thread');
  const own = workers.start(ECHO_RANK, rank(0));
  assert.is(own.warm, false);
  await own.worker.terminate();
  await workers.drain();
});

test('a start refused before its machine runs (its inspect port in use) leaves no thread behind', async () => {
  const blocker = createServer();
  await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
  const port = (blocker.address() as AddressInfo).port;
  const dir = makeTempDir('warmrefused');
  const refused = () =>
    startNode({ model: exampleModel, device: 'host', tensorParallelSize: 2, socketDir: `${dir}/s`, logger: pino({ level: 'silent' }), progress: false, inspect: { port } }).then(
      () => assert.unreachable('started'),
      (err: UsageError) => assert.is(err.code, 'E_INSPECT_BIND'),
    );
  const threads = () => readdirSync('/proc/self/task').length;
  try {
    // The first start makes the threads any start makes (libuv's pool): the second is counted.
    await refused();
    const before = threads();
    await refused();
    // At most as many: a thread of an earlier test may still be ending; a warm one would stay.
    assert.ok(threads() <= before, `${threads()} threads after the refused start, ${before} before`);
  } finally {
    blocker.close();
    removeDir(dir);
  }
});

test('a node takes a warm thread per local rank; a restart that finds its keeper running starts none, and adopts', async () => {
  const dir = makeTempDir('warmranks');
  const socketDir = `${dir}/s`;
  const taken = (lines: string[]) => lines.map((l) => JSON.parse(l) as { msg: string; warm?: boolean }).filter((l) => /worker thread|warm$/.test(l.msg));
  try {
    const first = capturedLog();
    first.logger.level = 'debug';
    let node = await startNode({ model: exampleModel, device: 'host', tensorParallelSize: 2, socketDir, keeper: { mode: 'spawn', adoptWithinS: 60 }, logger: first.logger, progress: false });
    await node.ready;
    await node.stop();
    await node.done;
    assert.equal(
      // The ranks start in either order.
      taken(first.lines).map((l) => [l.msg, l.warm]).sort(),
      [
        ['rank 0: worker thread started (warm: it loaded its modules while the node planned)', true],
        ['rank 1: worker thread started (warm: it loaded its modules while the node planned)', true],
        ['started 2 rank thread(s) warm', undefined],
      ],
    );

    const restart = capturedLog();
    restart.logger.level = 'debug';
    node = await startNode({ model: exampleModel, device: 'host', tensorParallelSize: 2, socketDir, keeper: { mode: 'spawn', adoptWithinS: 60 }, logger: restart.logger, progress: false });
    const status = await node.ready;
    assert.equal(
      status.ranks.map((r) => r.source?.from),
      ['keeper', 'keeper'],
    );
    assert.equal(taken(restart.lines), [], 'no rank thread, warm or not, starts');
    await node.stop();
    await node.done;
  } finally {
    await killKeeper(new KeeperClient(`${socketDir}/keeper.sock`));
    removeDir(dir);
  }
});

test("a rank the main thread asked the keeper for passes its adopt phase without loading the keeper's side", () => {
  // In a fresh process that records every module it loads (test/cli/fixtures/recordModules.ts):
  // the keeper's side and zod's schemas are 50-90 ms of a thread's start on the VM, which a rank
  // that loads needs only after its fill (warmRankWorker.ts).
  const record = join(freshTempDir(), 'modules.txt');
  const phases = new URL('../../src/actors/rankPhases.js', import.meta.url).href;
  const script = `
    const { rankPhases } = await import(${JSON.stringify(phases)});
    const data = { device: { backend: 'host', index: 0, uuid: 'host-test-0' }, keeper: { socket: '/nonexistent/keeper.sock' }, keeperAsked: {} };
    const none = await rankPhases.adopt(undefined, data, () => {});
    const refused = await rankPhases.adopt(undefined, { ...data, keeperAsked: { refused: 'a record for another plan' } }, () => {});
    console.log(JSON.stringify({ none: none ?? null, refused }));`;
  const recorder = new URL('../cli/fixtures/recordModules.js', import.meta.url).href;
  const r = spawnSync(process.execPath, ['--import', recorder, '--input-type=module', '-e', script], { encoding: 'utf8', env: { ...process.env, WEIGHTD_TEST_MODULES: record } });
  assert.is(r.status, 0, r.stderr);
  assert.equal(JSON.parse(r.stdout), { none: null, refused: { refused: 'a record for another plan' } });
  const modules = readFileSync(record, 'utf8');
  assert.ok(modules.includes('/dist/src/actors/rankPhases.js'), 'the record saw the phases load');
  assert.not.ok(modules.includes('/dist/src/actors/rankKeeping.js'), "the keeper's side loaded");
});

test.run();
