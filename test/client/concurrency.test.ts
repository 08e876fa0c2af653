// 32 client processes (TypeScript and Python) attach, verify and detach in a loop against both
// ranks of a tp=2 daemon for WEIGHTD_CONCURRENCY_SECONDS (default 20): no client errs, and
// afterwards nothing is left over: daemon descriptors, client mappings, leases.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel } from '../helpers/paths.js';
import { runClient, type ClientLanguage } from './runClient.js';

const SECONDS = Number(process.env.WEIGHTD_CONCURRENCY_SECONDS ?? 20);
const CLIENTS = 32;
const TP = 2;

interface LoopReply {
  iterations: number;
  mapsBefore: number;
  mapsAfter: number;
  openFdsAfterFirst: number;
  openFdsAfter: number;
}

test(`${CLIENTS} concurrent clients attach/detach for ${SECONDS} s with nothing leaked`, async () => {
  const dir = makeTempDir('conc');
  const daemon = await startDaemon({ model: exampleModel, tp: TP, socketDir: dir });
  try {
    const sockets = await Promise.all(Array.from({ length: TP }, (_, r) => findSocket({ socketDir: dir, globalRank: r })));
    const expected = await Promise.all(Array.from({ length: TP }, (_, r) => expectedFingerprint(exampleModel, TP, r)));
    const fdsBefore = daemon.fdCount();

    const results = await Promise.all(
      Array.from({ length: CLIENTS }, (_, i) => {
        const rank = i % TP;
        const lang: ClientLanguage = i % 4 === 3 ? 'python' : 'ts';
        return runClient<LoopReply>(lang, 'loop', sockets[rank]!, expected[rank]!, String(SECONDS * 1000)).then((r) => ({ ...r, lang, rank }));
      }),
    );
    for (const r of results) {
      assert.ok(r.iterations > 0, `a ${r.lang} client on rank ${r.rank} made no progress`);
      assert.is(r.mapsBefore, 0);
      assert.is(r.mapsAfter, 0, `a ${r.lang} client on rank ${r.rank} kept ${r.mapsAfter} mappings`);
      assert.is(r.openFdsAfter, r.openFdsAfterFirst, `a ${r.lang} client on rank ${r.rank} leaked descriptors over ${r.iterations} attaches`);
    }
    const total = results.reduce((a, r) => a + r.iterations, 0);
    console.log(`  ${total} attach/detach cycles by ${CLIENTS} clients in ${SECONDS} s`);

    for (const socket of sockets) {
      const c = await WeightdClient.connect(socket);
      const stats = await c.stats();
      assert.equal(stats.leases, [], `no lease left on ${socket}`);
      assert.is(stats.protocolErrors, 0);
      c.close();
    }
    // Client connections close on their side first; give the daemon a moment to see them go.
    const until = Date.now() + 5000;
    while (daemon.fdCount() > fdsBefore && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
    assert.ok(daemon.fdCount() <= fdsBefore, `daemon descriptors ${fdsBefore} -> ${daemon.fdCount()}`);
  } finally {
    await daemon.stop();
    removeDir(dir);
  }
});

test.run();
