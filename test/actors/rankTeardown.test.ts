// A real rank actor (worker thread + addon) that throws, exits, or fails its device at each
// phase must tear the whole node down: failure names the rank, every worker ends, and no
// shared-memory file is left.
import { readdirSync, rmSync } from 'node:fs';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { FaultKind, FaultPhase } from '../../src/actors/rankMessages.js';
import { startNode } from '../../src/startNode.js';
import { exampleModel, freshShmDir, freshSocketDir } from '../helpers/paths.js';

const phases: FaultPhase[] = ['open', 'allocate', 'fill', 'export', 'serve'];
const kinds: FaultKind[] = ['throw', 'exit', 'device'];
const expected: Record<FaultKind, RegExp> = {
  throw: /injected fault in rank 1/,
  exit: /exited with code 7/,
  device: /E_|unknown device backend|cannot create shared-memory file|cannot open checkpoint file|before allocate|export/i,
};

for (const phase of phases) {
  for (const kind of kinds) {
    test(`rank 1 ${kind} at ${phase}: the node fails, naming rank 1, and leaves nothing`, async () => {
      const shmDir = freshShmDir();
      try {
        const node = await startNode({
          model: exampleModel,
          tensorParallelSize: 2,
          device: 'host',
          shmDir,
          socketDir: freshSocketDir(),
          logger: pino({ level: 'silent' }),
          faultInjection: { localRank: 1, phase, kind },
        });
        let readyRejected = false;
        node.ready.catch(() => (readyRejected = true));
        const result = await node.done;
        assert.is(result.state, 'failed');
        // Before its export a rank cannot have loaded, so the node never became ready.
        if (['open', 'allocate', 'fill'].includes(phase)) assert.ok(readyRejected, 'ready rejects');
        assert.is(result.failure?.globalRank, 1, `failure names rank 1: ${result.failure?.message}`);
        assert.match(result.failure!.message, /^rank 1 \(local 1\) failed: /);
        assert.match(result.failure!.message + ' ' + result.failure!.code, expected[kind]);
        assert.equal(readdirSync(shmDir), [], 'no shared-memory segment is left');
        assert.is(node.status().state, 'failed');
      } finally {
        rmSync(shmDir, { recursive: true, force: true });
      }
    });
  }
}

test('without a fault the same node loads, and stop() frees everything', async () => {
  const shmDir = freshShmDir();
  try {
    const node = await startNode({ model: exampleModel, tensorParallelSize: 2, device: 'host', shmDir, socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
    await node.ready;
    assert.is(readdirSync(shmDir).length, 2, 'one segment per rank while ready');
    const result = await node.stop('test');
    assert.is(result.state, 'stopped');
    assert.equal(readdirSync(shmDir), []);
  } finally {
    rmSync(shmDir, { recursive: true, force: true });
  }
});

test.run();
