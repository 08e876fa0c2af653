// Observability of a real node (host backend), through the programmatic API and the CLI: the
// inspect server starts with the node and closes with it, metrics and events match what the
// node did, a failure is counted, and the flags are checked before anything starts.
import { createServer } from 'node:net';
import { Writable } from 'node:stream';
import pino from 'pino';
import { test } from 'uvu';
import { WeightdClient, expectedFingerprint } from '../../src/client/index.js';
import * as assert from 'uvu/assert';
import { startNode, toStatusView, UsageError, type NodeEvent } from '../../src/index.js';
import { startDaemon } from '../helpers/daemon.js';
import { weightdMemfds } from '../helpers/memfds.js';
import { exampleModel, freshSocketDir } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';
import { waitUntil } from '../helpers/keeper.js';
import { faultyRankWorker } from '../actors/fixtures/faultyRankWorker.js';
import { httpGet } from './httpGet.js';

const silent = pino({ level: 'silent' });

test('API: inspect server up with the node, status/metrics/events agree, closed on stop', async () => {
  const node = await startNode({ model: exampleModel, tensorParallelSize: 2, device: 'host', socketDir: freshSocketDir(), logger: silent, inspect: { port: 0 } });
  const url = node.inspectUrl!;
  assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/);
  const live: NodeEvent[] = [];
  node.onEvent((e) => live.push(e));
  const status = await node.ready;
  assert.is((await httpGet(`${url}/healthz`)).status, 200);
  const view = JSON.parse((await httpGet(`${url}/status`)).body);
  const expected = toStatusView(node.status());
  assert.equal({ ...view, time: '' }, { ...expected, time: '' }, '/status is toStatusView(node.status())');
  assert.equal(view.ranks.map((r: { bytes: number; totalBytes: number }) => r.bytes === r.totalBytes && r.totalBytes > 0), [true, true]);

  const metrics = await node.metrics();
  assert.is((await httpGet(`${url}/metrics`)).body, metrics);
  for (const r of status.ranks) {
    assert.ok(metrics.includes(`weightd_rank_loaded_bytes{global_rank="${r.globalRank}",local_rank="${r.localRank}"} ${r.totalBytes}\n`), metrics);
  }
  assert.ok(metrics.includes('weightd_node_state{state="ready"} 1'));
  assert.ok(node.metricsRegistry.getSingleMetric('weightd_node_ready'), 'the registry is exposed for merging');

  // Clients and leases come from the rank's live socket server.
  const client = await WeightdClient.connect(status.ranks[0]!.socketPath!);
  const attached = await client.attach(await expectedFingerprint(exampleModel, 2, 0));
  assert.is(attached.status, 'attached');
  const busy = JSON.parse((await httpGet(`${url}/status`)).body);
  assert.equal([busy.ranks[0].clients, busy.ranks[0].leases, busy.ranks[1].leases], [1, 1, 0]);
  assert.ok((await node.metrics()).includes('weightd_rank_leases{global_rank="0",local_rank="0"} 1'));
  if (attached.status === 'attached') await attached.detach();
  await client.close();
  assert.is(JSON.parse((await httpGet(`${url}/status`)).body).ranks[0].leases, 0);

  const types = node.recentEvents().map((e) => e.type);
  for (const t of ['xstate.init', 'xstate.done.actor.prepare', 'GROUP_JOINED', 'RANK_DEVICE', 'RANK_LOADED', 'RANK_SERVING']) assert.ok(types.includes(t), `${t} in ${types}`);
  assert.is(node.recentEvents().at(-1)!.seq, Math.max(...node.recentEvents().map((e) => e.seq)));

  await node.stop('test');
  // The supervisor's moves (a model actor's name their model, the model registry's say so).
  const moves = live.filter((e) => e.from && !e.model && !e.registry).map((e) => `${e.from}->${e.state}`);
  assert.equal(moves.slice(-2), ['ready->stopping', 'stopping->stopped']);
  assert.ok(live.some((e) => e.type === 'RANK_STOP' && e.to === 'rank-0'));
  await httpGet(`${url}/healthz`).then(
    () => assert.unreachable('the server closes with the node'),
    (err: NodeJS.ErrnoException) => assert.is(err.code, 'ECONNREFUSED'),
  );
});

test("health means serving: once the node's own model is unloaded, /healthz, /status and the metrics say not ready; a new version of its name makes it ready again", async () => {
  const node = await startNode({ model: exampleModel, tensorParallelSize: 1, device: 'host', socketDir: freshSocketDir(), logger: silent, inspect: { port: 0 } });
  const url = node.inspectUrl!;
  /** What each of the three says, read at once. */
  const health = async () => {
    const h = await httpGet(`${url}/healthz`);
    const status = JSON.parse((await httpGet(`${url}/status`)).body) as { state: string; ready: boolean };
    const gauge = /^weightd_node_ready (\d)$/m.exec(await node.metrics())?.[1];
    return { healthz: h.status, body: JSON.parse(h.body), status: [status.state, status.ready], metric: gauge };
  };
  try {
    await node.ready;
    assert.equal(await health(), { healthz: 200, body: { ready: true, state: 'ready', model: 'serving' }, status: ['ready', true], metric: '1' });
    await node.unload(node.config.models[0].name);
    await waitUntil('the own model is released', () => node.status().models[0]!.state === 'released');
    // The supervisor is still ready (other models could serve), but what the node was started for is not served.
    assert.equal(await health(), { healthz: 503, body: { ready: false, state: 'ready', model: 'released' }, status: ['ready', false], metric: '0' });
    const again = await node.load({ model: exampleModel, name: node.config.models[0].name });
    assert.is(again.model.state, 'serving');
    assert.equal(await health(), { healthz: 200, body: { ready: true, state: 'ready', model: 'serving' }, status: ['ready', true], metric: '1' });
  } finally {
    await node.stop();
  }
});

test('API: a rank failure is counted by its code; the progress lines are logged', async () => {
  const lines: Array<Record<string, unknown>> = [];
  const logger = pino({ level: 'info' }, new Writable({ write(c, _e, cb) { lines.push(JSON.parse(String(c))); cb(); } }));
  const ok = await startNode({ model: exampleModel, tensorParallelSize: 2, device: 'host', socketDir: freshSocketDir(), logger });
  await ok.ready;
  await ok.stop();
  assert.ok(lines.some((l) => /^rank 1 loaded 5\.0 MB in \S+ m?s \(\S+ [kMG]?B\/s\)$/.test(String(l.msg)) && l.globalRank === 1), 'a summary per rank');
  assert.ok(lines.some((l) => String(l.msg).startsWith('all 2 local ranks loaded: 10.0 MB in ')), 'and for the node');

  const node = await startNode(
    { model: exampleModel, tensorParallelSize: 2, device: 'host', socketDir: freshSocketDir(), logger: silent },
    { rankWorker: faultyRankWorker({ localRank: 1, phase: 'fill', kind: 'device' }) },
  );
  const result = await node.done;
  assert.is(result.state, 'failed');
  const metrics = await node.metrics();
  const code = result.failure!.code;
  assert.ok(metrics.includes(`weightd_errors_total{code="${code}"} 1\n`), `${code} counted once:\n${metrics}`);
  assert.ok(metrics.includes('weightd_node_state{state="failed"} 1'));
  const failed = node.recentEvents().find((e) => e.type === 'RANK_FAILED')!;
  assert.equal([failed.from, failed.state, (failed.data.error as { code: string }).code], ['loading', 'failed', code]);
});

test('API: an inspect port in use fails the start before anything is loaded', async () => {
  const blocker = createServer();
  await new Promise<void>((r) => blocker.listen(0, '127.0.0.1', () => r()));
  const port = (blocker.address() as { port: number }).port;
  try {
    await startNode({ model: exampleModel, device: 'host', socketDir: freshSocketDir(), logger: silent, inspect: { port } }).then(
      () => assert.unreachable('started'),
      (err: UsageError) => {
        assert.instance(err, UsageError);
        assert.is(err.code, 'E_INSPECT_BIND');
      },
    );
    assert.equal(weightdMemfds(), [], 'nothing allocated');
    await startNode({ model: exampleModel, device: 'host', logger: silent, inspect: { port: 70000 } }).then(
      () => assert.unreachable('started'),
      (err: UsageError) => assert.match(err.message, /--inspect-port 70000: must be an integer from 0 to 65535/),
    );
    await startNode({ model: exampleModel, device: 'host', logger: silent, progress: { intervalMs: 5 } }).then(
      () => assert.unreachable('started'),
      (err: UsageError) => assert.match(err.message, /progress\.intervalMs 5: must be an integer from 100/),
    );
  } finally {
    blocker.close();
  }
});

test('CLI: --inspect-port serves a ready daemon, which still exits 0 on SIGTERM', async () => {
  const d = await startDaemon({ model: exampleModel, tp: 2, socketDir: freshSocketDir(), extraArgs: ['--inspect-port', '0'] });
  try {
    const url = /inspect server listening: (http:\/\/127\.0\.0\.1:\d+)\/statechart/.exec(d.stderr())?.[1];
    assert.ok(url, `the log says where:\n${d.stderr()}`);
    const health = await httpGet(`${url}/healthz`);
    assert.is(health.status, 200);
    const s = JSON.parse((await httpGet(`${url}/status`)).body);
    assert.is(s.pid, d.pid);
    assert.is(s.ranks.length, 2);
  } finally {
    const { code } = await d.stop();
    assert.is(code, 0);
  }
});

const m = ['--model', exampleModel];
for (const [name, args, message] of [
  ['host without port', [...m, '--inspect-host', '127.0.0.1'], /--inspect-port is required with --inspect-host/],
  ['port out of range', [...m, '--inspect-port', '65536'], /--inspect-port 65536: must be an integer from 0 to 65535/],
  ['port not a number', [...m, '--inspect-port', 'http'], /--inspect-port "http": must be an integer/],
  ['port taken by rendezvous', [...m, '--weight-cache-master-port', '29611', '--inspect-port', '29611'], /--inspect-port 29611: equals a rendezvous port \(--weight-cache-master-port/],
  ['empty host', [...m, '--inspect-port', '0', '--inspect-host', ' '], /--inspect-host " ": is empty/],
] as Array<[string, string[], RegExp]>) {
  test(`CLI: bad inspect flag: ${name}`, async () => {
    const r = await runCli(args);
    assert.is(r.code, 2, r.stderr);
    assert.match(r.messages, message);
  });
}

test.run();
