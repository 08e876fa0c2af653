// A real rank actor (worker thread + addon) that throws, exits, or fails its device at each
// phase (a fixture worker, test/actors/fixtures/faultyRankWorker.ts) must tear the whole node
// down: failure names the rank, every worker ends, and no segment (memfd) is left open.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { startNode } from '../../src/startNode.js';
import { weightdMemfds } from '../helpers/memfds.js';
import { exampleModel, freshSocketDir } from '../helpers/paths.js';
import { faultKinds, faultPhases, faultyRankWorker, type FaultKind, type FaultPhase } from './fixtures/faultyRankWorker.js';

const expected: Record<Exclude<FaultKind, 'device'>, RegExp> = {
  throw: /fixture rank 1 throws at/,
  exit: /exited with code 7/,
};
/** The addon's own error for each phase's device failure. */
const deviceCodes: Record<FaultPhase, string> = { open: 'E_BAD_BACKEND', allocate: 'E_OUT_OF_MEMORY', fill: 'E_FILE_OPEN', verify: 'E_FILE_CHANGED', export: 'E_NOT_ALLOCATED', serve: 'E_NOT_ALLOCATED' };

for (const phase of faultPhases) {
  for (const kind of faultKinds) {
    test(`rank 1 ${kind} at ${phase}: the node fails, naming rank 1, and leaves nothing`, async () => {
      const node = await startNode(
        { model: exampleModel, tensorParallelSize: 2, device: 'host', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) },
        { rankWorker: faultyRankWorker({ localRank: 1, phase, kind }) },
      );
      let readyRejected = false;
      node.ready.catch(() => (readyRejected = true));
      const result = await node.done;
      assert.is(result.state, 'failed');
      // Before its export a rank cannot have loaded, so the node never became ready.
      if (['open', 'allocate', 'fill', 'verify'].includes(phase)) assert.ok(readyRejected, 'ready rejects');
      assert.is(result.failure?.globalRank, 1, `failure names rank 1: ${result.failure?.message}`);
      assert.match(result.failure!.message, /^rank 1 \(local 1\) failed: /);
      if (kind === 'device') assert.is(result.failure!.code, deviceCodes[phase], result.failure!.message);
      else assert.match(result.failure!.message, expected[kind]);
      assert.equal(weightdMemfds(), [], 'no segment is left open');
      assert.is(node.status().state, 'failed');
    });
  }
}

test('without a fault the same node loads, and stop() frees everything', async () => {
  const node = await startNode({ model: exampleModel, tensorParallelSize: 2, device: 'host', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
  await node.ready;
  assert.is(weightdMemfds().length, 2, 'one segment per rank while ready');
  const result = await node.stop('test');
  assert.is(result.state, 'stopped');
  assert.equal(weightdMemfds(), []);
});

test.run();
