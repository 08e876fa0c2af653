// The programmatic API: start, observe, await readiness, read status, stop, in-process.
import { existsSync } from 'node:fs';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { startNode, UsageError, type NodeState } from '../../src/index.js';
import { weightdMemfds } from '../helpers/memfds.js';
import { exampleModel, freshSocketDir } from '../helpers/paths.js';

test('starts, reports every state in order, serves status, and stops cleanly', async () => {
  const node = await startNode({ model: exampleModel, tensorParallelSize: 2, device: 'host', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
  const seen: NodeState[] = [];
  node.onStateChange((s) => seen.push(s.state));
  const status = await node.ready;
  assert.is(status.state, 'ready');
  assert.is(status.architecture, 'LlamaForCausalLM');
  assert.match(status.fingerprint!, /^[0-9a-f]{64}$/);
  assert.equal(status.rankTable.map((r) => r.globalRank), [0, 1]);
  for (const r of status.ranks) {
    assert.is(r.state, 'serving');
    assert.ok(r.socketPath && existsSync(r.socketPath), `rank ${r.globalRank} has a socket`);
    assert.is(r.bytes, r.totalBytes, `rank ${r.globalRank} loaded all its bytes`);
    assert.ok(r.totalBytes > 0);
    assert.is(r.device?.backend, 'host');
    assert.is(r.segments?.length, 1);
  }
  assert.is(weightdMemfds().length, 2, 'one segment per rank');
  const sockets = status.ranks.map((r) => r.socketPath!);
  const result = await node.stop();
  for (const s of sockets) assert.not.ok(existsSync(s), `${s} removed`);
  assert.equal(result, { state: 'stopped' });
  assert.is(node.status().state, 'stopped');
  assert.equal(seen.slice(seen.indexOf('ready')), ['ready', 'stopping', 'stopped']);
  assert.equal(weightdMemfds(), []);
  assert.equal(await node.stop(), { state: 'stopped' }, 'a second stop is harmless');
});

test('stop during start-up ends the node without a failure', async () => {
  const socketDir = freshSocketDir();
  const node = await startNode({ model: exampleModel, device: 'host', socketDir, logger: pino({ level: 'silent' }) });
  const result = await node.stop('early');
  assert.is(result.state, 'stopped');
  await node.ready.then(() => assert.unreachable('ready must reject'), (e: Error) => assert.match(e.message, /stopped before it was ready/));
  assert.equal(weightdMemfds(), []);
  // The stopped node's device locks are gone at once: a restart in this process gets them.
  const again = await startNode({ model: exampleModel, device: 'host', socketDir, logger: pino({ level: 'silent' }) });
  await again.ready;
  assert.is((await again.stop()).state, 'stopped');
});

test('bad options reject with UsageError before anything starts', async () => {
  try {
    await startNode({ model: exampleModel, tensorParallelSize: 3, nnodes: 2 });
    assert.unreachable();
  } catch (err) {
    assert.instance(err, UsageError);
    assert.is((err as UsageError).code, 'E_USAGE');
  }
});

test.run();
