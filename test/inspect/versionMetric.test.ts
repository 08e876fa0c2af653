// weightd_model_version (docs/weight-updates.md): each resident version's number, with `current`
// 1 for the one clients are pointed to. A version replaced by a hot swap and still leased is
// resident and not current; status says the same.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, WeightdClient } from '../../src/client/index.js';
import { EventFeed } from '../../src/inspect/eventFeed.js';
import { NodeMetrics } from '../../src/inspect/nodeMetrics.js';
import { startNode } from '../../src/index.js';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';

test('each resident version has its number and whether it is current, in /metrics and in status', async () => {
  const v2 = writeVariant(exampleModel, `${freshTempDir()}/v2`);
  const node = await startNode({ model: exampleModel, device: 'host', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
  const metrics = new NodeMetrics({ status: () => node.status(), feed: new EventFeed(), states: () => [] });
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    const holder = await WeightdClient.connect(socket);
    await holder.attach(await expectedFingerprint(exampleModel, 1, 0));
    const loaded = await node.load({ model: v2, name: 'tiny-llama' });
    const old = node.status().models.find((m) => m.own)!;
    assert.equal([old.state, old.version, old.current], ['draining', 0, false]);
    const now = node.status().models.find((m) => m.fingerprint === loaded.fingerprint)!;
    assert.equal([now.state, now.version, now.current], ['serving', 0, true]);
    const samples = (await metrics.text()).split('\n').filter((l) => l.startsWith('weightd_model_version'));
    assert.equal(samples.sort(), [
      `weightd_model_version{model="tiny-llama",fingerprint="${loaded.fingerprint}",current="1"} 0`,
      `weightd_model_version{model="tiny-llama",fingerprint="${old.fingerprint}",current="0"} 0`,
    ].sort());
    holder.close();
  } finally {
    metrics.close();
    await node.stop();
  }
});

test.run();
