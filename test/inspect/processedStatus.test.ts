// Processed layouts (docs/engines.md, "Publishing what the engine computed") are memory a version's
// rank holds besides its segments: status, /status's view, the metrics and a socket's stats name
// each one with its key, bytes, the engines that map it now and when it was published and mapped.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, WeightdClient } from '../../src/client/index.js';
import { EventFeed } from '../../src/inspect/eventFeed.js';
import { NodeMetrics } from '../../src/inspect/nodeMetrics.js';
import { toStatusView } from '../../src/inspect/statusView.js';
import { startNode } from '../../src/index.js';
import { exampleModel, freshSocketDir } from '../helpers/paths.js';
import { publishOverSocket, socketAsker } from '../helpers/publishOverSocket.js';

test('a published layout shows in status, /status, the metrics and stats, with its bytes, leases and times', async () => {
  const node = await startNode({ model: exampleModel, device: 'host', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
  const metrics = new NodeMetrics({ status: () => node.status(), feed: new EventFeed(), states: () => [] });
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    const base = (await expectedFingerprint(exampleModel, 1, 0)).fingerprint;
    const key = 'f'.repeat(32);
    const before = Date.now();
    assert.is((await publishOverSocket(socket, { model: 'tiny-llama', base, key, tensors: [{ name: 'w', dtype: 'F32', shape: [100] }] })).ok, true);
    const engine = await socketAsker(socket);
    const found = await engine.ask({ cmd: 'get_processed', fingerprint: base, key, pid: process.pid });
    assert.is(found.status, 'found');

    const own = node.status().models[0]!;
    const [layout] = own.ranks[0]!.processed!;
    assert.equal([layout!.key, layout!.base, layout!.bytes, layout!.leases], [key, base, 400, 1]);
    assert.ok(layout!.publishedAt >= before && layout!.lastMappedAt! >= layout!.publishedAt);
    assert.is(own.processedBytes, 400);
    assert.is(own.leases, 1, "get_processed's lease holds the version too");

    const view = toStatusView(node.status()).models[0]!;
    assert.is(view.processedBytes, 400);
    assert.equal(view.ranks[0]!.processed, [{ key, bytes: 400, leases: 1, publishedAt: new Date(layout!.publishedAt).toISOString(), lastMappedAt: new Date(layout!.lastMappedAt!).toISOString() }]);

    const text = await metrics.text();
    const labels = `{model="tiny-llama",version="0",global_rank="0",key="${key}"}`;
    assert.ok(text.includes(`weightd_processed_layout_bytes${labels} 400`), text);
    assert.ok(text.includes(`weightd_processed_layout_leases${labels} 1`));
    assert.ok(text.includes(`weightd_processed_layout_published_timestamp_seconds${labels} ${layout!.publishedAt / 1000}`));

    const client = await WeightdClient.connect(socket);
    assert.equal((await client.stats()).processed?.map((p) => [p.key, p.bytes, p.leases]), [[key, 400, 1]]);
    client.close();

    assert.is((await engine.ask({ cmd: 'detach', leaseId: found.leaseId })).ok, true);
    assert.is(node.status().models[0]!.ranks[0]!.processed![0]!.leases, 0, 'its lease ended: no engine maps it');
    engine.close();
  } finally {
    metrics.close();
    await node.stop();
  }
});

test.run();
