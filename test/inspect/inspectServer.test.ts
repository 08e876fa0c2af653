// The inspect server against a supervisor driven by hand (fake children): each endpoint, what
// it must never publish, the loopback guard, the live event stream, and closing.
import { connect, type Socket } from 'node:net';
import { Writable } from 'node:stream';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor } from 'xstate';
import { UsageError } from '../../src/errors.js';
import { EventFeed } from '../../src/inspect/eventFeed.js';
import { InspectServer, isLoopback, type InspectLimits } from '../../src/inspect/inspectServer.js';
import { machineToChart, machineToMermaid } from '../../src/inspect/machineToMermaid.js';
import { NodeMetrics } from '../../src/inspect/nodeMetrics.js';
import { supervisorMachine } from '../../src/machines/supervisor.js';
import { statusOf } from '../../src/startNode.js';
import { FakeWorld, sendToNode, fakeConfig, fakeInput, fakePrepared, fakeRankTable } from '../helpers/fakeNode.js';
import { waitUntil } from '../helpers/keeper.js';
import { httpGet, SseStream } from './httpGet.js';

type Ev = Parameters<ReturnType<typeof createActor<typeof supervisorMachine>>['send']>[0];
const device = (r: number) => ({ backend: 'host' as const, index: r, uuid: `fake-${r}`, name: 'fake', totalBytes: 1 << 30, freeBytes: 1 << 30 });
const HANDLE = 'c2VjcmV0LWlwYy1oYW5kbGUtb2YtNjQtYnl0ZXMtLS0tLS0tLS0tLS0tLS0tLS0tLQ==';
const chart = machineToChart(supervisorMachine);

async function harness(host = '127.0.0.1', limits?: Partial<InspectLimits>) {
  const logLines: Array<Record<string, unknown>> = [];
  const log = pino({ level: 'info' }, new Writable({ write(c, _e, cb) { logLines.push(JSON.parse(String(c))); cb(); } }));
  const feed = new EventFeed();
  const actor = createActor(supervisorMachine.provide(new FakeWorld().implementations()), { input: fakeInput(), inspect: feed.inspect });
  actor.start();
  const status = () => statusOf(actor.getSnapshot(), fakeConfig());
  const metrics = new NodeMetrics({ status, feed, states: () => chart.states.map((s) => s.key) });
  const server = await InspectServer.listen({ host, port: 0, log, status, feed, metrics, charts: [chart], limits });
  const send = (e: unknown) => sendToNode(actor, e as Ev);
  const toLoading = () => {
    send({ type: 'xstate.done.actor.prepare', output: fakePrepared });
    send({ type: 'GROUP_JOINED', rankTable: fakeRankTable });
    for (const r of [0, 1]) send({ type: 'RANK_DEVICE', localRank: r, info: device(r) });
  };
  const toReady = () => {
    toLoading();
    for (const r of [0, 1]) send({ type: 'RANK_LOADED', localRank: r, device: device(r), segments: [{ segment: 0, bytes: 256, handle: HANDLE }], bytes: 256, seconds: 0.5, source: { from: 'checkpoint' } });
    for (const r of [0, 1]) send({ type: 'RANK_SERVING', localRank: r, socketPath: `/fake/sockets/fake-${r}.sock` });
  };
  return { server, url: server.url, send, toLoading, toReady, logLines, metrics, actor };
}

test('connections over the cap are answered 503 and closed at once; /healthz answers once they go', async () => {
  const h = await harness('127.0.0.1', { maxConnections: 2 });
  const held: Socket[] = [];
  try {
    h.toReady();
    for (let i = 0; i < 2; i++) {
      const s = connect(Number(new URL(h.url).port), '127.0.0.1');
      held.push(s);
      await new Promise((resolve) => s.once('connect', resolve));
    }
    // Accepted after the two: over the cap. It sends nothing, so nothing it sent is lost to a reset.
    const over = await new Promise<string>((resolve) => {
      const s = connect(Number(new URL(h.url).port), '127.0.0.1');
      let got = '';
      s.on('data', (d) => (got += d));
      s.on('error', () => {});
      s.on('close', () => resolve(got));
    });
    assert.match(over, /^HTTP\/1\.1 503 Service Unavailable\r\n[^]*\r\n\r\nthe inspect server holds as many connections as it may; try again shortly\n$/);
    assert.ok(h.logLines.some((l) => l.msg === 'refused an inspect connection: inspect server: 2 connections are open, its most'), JSON.stringify(h.logLines));
    for (const s of held) s.destroy();
    await waitUntil('/healthz answers once the held connections are gone', async () => (await httpGet(`${h.url}/healthz`)).status === 200);
  } finally {
    for (const s of held) s.destroy();
    await h.server.close();
  }
});

test('/healthz: 503 with the state until ready, then 200', async () => {
  const h = await harness();
  try {
    h.toLoading();
    const loading = await httpGet(`${h.url}/healthz`);
    assert.is(loading.status, 503);
    assert.equal(JSON.parse(loading.body), { ready: false, state: 'loading' });
    h.toReady();
    const ready = await httpGet(`${h.url}/healthz`);
    assert.is(ready.status, 200);
    assert.equal(JSON.parse(ready.body), { ready: true, state: 'ready', model: 'serving' });
    assert.is((await httpGet(`${h.url}/healthz`, { method: 'HEAD' })).body, '', 'HEAD has no body');
  } finally {
    await h.server.close();
  }
});

test('/status: state, ranks with rate and eta, rank table, peers; no handles', async () => {
  const h = await harness();
  try {
    h.toLoading();
    h.send({ type: 'RANK_PROGRESS', localRank: 0, bytes: 64, totalBytes: 256, seconds: 0.5 });
    const loading = JSON.parse((await httpGet(`${h.url}/status`)).body);
    assert.is(loading.state, 'loading');
    assert.is(loading.registryState, 'startup', "the model registry's own state, which the page highlights");
    assert.equal(
      { state: loading.ranks[0].state, bytes: loading.ranks[0].bytes, rate: loading.ranks[0].bytesPerSecond, eta: loading.ranks[0].etaSeconds, uuid: loading.ranks[0].device.uuid },
      { state: 'loading', bytes: 64, rate: 128, eta: 1.5, uuid: 'fake-0' },
    );
    h.toReady();
    h.send({ type: 'PEER_LOST', nodeRank: 1, reason: 'heartbeat timeout' });
    const res = await httpGet(`${h.url}/status`);
    assert.match(String(res.headers['content-type']), /application\/json/);
    assert.not.ok(res.body.includes(HANDLE), 'no IPC handle over HTTP');
    const s = JSON.parse(res.body);
    assert.is(s.state, 'ready');
    assert.is(s.registryState, 'running');
    assert.equal(s.ranks.map((r: { state: string; socketPath: string }) => [r.state, r.socketPath]), [['serving', '/fake/sockets/fake-0.sock'], ['serving', '/fake/sockets/fake-1.sock']]);
    assert.equal(Object.keys(s.ranks[0]).sort(), ['adoptedOn', 'bytes', 'bytesPerSecond', 'clients', 'descriptors', 'device', 'etaSeconds', 'globalRank', 'kept', 'keptAgeMs', 'keptAt', 'keptReason', 'leases', 'localRank', 'notAdopted', 'processed', 'seconds', 'serve', 'socketPath', 'source', 'state', 'totalBytes', 'waitingForGroup']);
    assert.equal([s.ranks[0].source, s.ranks[0].kept, s.keeper], ['checkpoint', null, null], 'read from the checkpoint, with no keeper');
    assert.equal([s.ranks[0].clients, s.ranks[0].leases, s.ranks[0].serve], [null, null, null], 'unknown without a server, not made up');
    assert.equal(s.rankTable, fakeRankTable);
    assert.equal(s.load, { bytes: 512, totalBytes: 512, seconds: 0.5, bytesPerSecond: 1024, etaSeconds: 0 });
    // The fake rank table is one node: a lost peer it does not list is not invented either.
    assert.equal(s.peers, []);
    assert.is(s.failure, null);
  } finally {
    await h.server.close();
  }
});

test('a rank waiting for its fill group says so in /status and /metrics while it loads, and no longer once it reads again or is loaded', async () => {
  const h = await harness();
  const look = async () => {
    const s = JSON.parse((await httpGet(`${h.url}/status`)).body) as { ranks: Array<{ waitingForGroup: boolean }> };
    const metrics = (await httpGet(`${h.url}/metrics`)).body.split('\n').filter((l) => l.startsWith('weightd_rank_waiting_for_group{'));
    return { status: s.ranks.map((r) => r.waitingForGroup), metrics };
  };
  try {
    h.toLoading();
    h.send({ type: 'RANK_PROGRESS', localRank: 0, bytes: 256, totalBytes: 256, seconds: 0.5, waitingForGroup: true });
    h.send({ type: 'RANK_PROGRESS', localRank: 1, bytes: 64, totalBytes: 256, seconds: 0.5, waitingForGroup: false });
    assert.equal(await look(), {
      status: [true, false],
      metrics: ['weightd_rank_waiting_for_group{global_rank="0",local_rank="0"} 1', 'weightd_rank_waiting_for_group{global_rank="1",local_rank="1"} 0'],
    });
    h.send({ type: 'RANK_PROGRESS', localRank: 0, bytes: 256, totalBytes: 256, seconds: 0.6, waitingForGroup: false });
    assert.equal((await look()).status, [false, false], 'a report that does not wait clears it');
    h.send({ type: 'RANK_PROGRESS', localRank: 0, bytes: 256, totalBytes: 256, seconds: 0.7, waitingForGroup: true });
    h.toReady();
    assert.equal(await look(), { status: [false, false], metrics: [] }, 'loaded: neither waits, and no series');
  } finally {
    await h.server.close();
  }
});

test('/metrics: Prometheus text from its own registry, errors counted once by code', async () => {
  const h = await harness();
  try {
    h.toLoading();
    h.send({ type: 'RANK_PROGRESS', localRank: 1, bytes: 128, totalBytes: 256, seconds: 1 });
    h.send({ type: 'RANK_FAILED', localRank: 1, error: { name: 'DeviceError', code: 'E_TEST_FAULT', message: 'boom' } });
    const res = await httpGet(`${h.url}/metrics`);
    assert.is(res.status, 200);
    assert.match(String(res.headers['content-type']), /^text\/plain; version=0\.0\.4/);
    const samples = res.body.split('\n').filter((l) => l && !l.startsWith('#'));
    for (const l of [
      'weightd_node_state{state="failed"} 1',
      'weightd_node_state{state="loading"} 0',
      'weightd_node_ready 0',
      'weightd_rank_loaded_bytes{global_rank="1",local_rank="1"} 128',
      'weightd_rank_total_bytes{global_rank="1",local_rank="1"} 256',
      'weightd_rank_load_seconds{global_rank="1",local_rank="1"} 1',
      'weightd_rank_state{global_rank="1",local_rank="1",state="failed"} 1',
      // The supervisor also passes the failure on to its group: still one error.
      'weightd_errors_total{code="E_TEST_FAULT"} 1',
    ]) {
      assert.ok(samples.includes(l), `missing ${l} in\n${samples.join('\n')}`);
    }
    assert.not.ok(samples.some((l) => l.startsWith('weightd_rank_clients') || l.startsWith('weightd_rank_leases')), 'no series for unknown values');
    assert.not.ok(samples.some((l) => l.startsWith('process_') || l.startsWith('nodejs_')), 'not the global registry');
    assert.is(await h.metrics.text(), (await httpGet(`${h.url}/metrics`)).body);
  } finally {
    await h.server.close();
  }
});

test('/status during rendezvous: who joined and who is missing, and the coordinator\'s state; only while in rendezvous', async () => {
  const h = await harness();
  try {
    h.send({ type: 'xstate.done.actor.prepare', output: fakePrepared });
    const before = JSON.parse((await httpGet(`${h.url}/status`)).body);
    assert.equal([before.state, before.formation, before.coordinatorState, before.registryState], ['rendezvous', null, null, null], 'no model registry before the node loads');
    h.send({ type: 'COORDINATOR_STATE', state: 'gathering' });
    h.send({ type: 'GROUP_WAITING', joined: [0], missing: [1, 2] });
    const waiting = JSON.parse((await httpGet(`${h.url}/status`)).body);
    assert.equal([waiting.formation, waiting.coordinatorState, waiting.peers], [{ joined: [0], missing: [1, 2] }, 'gathering', []]);
    h.send({ type: 'GROUP_JOINED', rankTable: fakeRankTable });
    h.send({ type: 'COORDINATOR_STATE', state: 'loading' });
    const loading = JSON.parse((await httpGet(`${h.url}/status`)).body);
    assert.equal([loading.state, loading.formation, loading.coordinatorState], ['loading', null, 'loading']);
  } finally {
    await h.server.close();
  }
});

test('the page, its chart and its assets are served locally', async () => {
  const h = await harness();
  try {
    const page = await httpGet(`${h.url}/statechart`);
    assert.is(page.status, 200);
    assert.match(String(page.headers['content-security-policy']), /script-src 'self'(;|$)/);
    assert.match(page.body, /<script src="\/assets\/mermaid\.min\.js"><\/script>/);
    assert.not.match(page.body, /https?:\/\//, 'nothing from the internet');
    const json = JSON.parse((await httpGet(`${h.url}/statechart.json`)).body);
    assert.equal(json.machines[0].chart, chart);
    assert.is(json.machines[0].mermaid, machineToMermaid(supervisorMachine));
    assert.is(json.machines[0].mermaidIds.loading, 'loading');
    const mermaid = await httpGet(`${h.url}/assets/mermaid.min.js`);
    assert.is(mermaid.status, 200);
    assert.match(String(mermaid.headers['content-type']), /javascript/);
    assert.ok(mermaid.body.length > 1_000_000, 'the real mermaid bundle');
    const progress = await httpGet(`${h.url}/assets/loadProgress.js`);
    assert.match(progress.body, /export function formatBytes/);
    assert.not.match(progress.body, /^import /m, 'loadable by itself in a browser');
    const script = await httpGet(`${h.url}/assets/statechart.js`);
    assert.match(script.body, /new EventSource\('\/events'\)/);
  } finally {
    await h.server.close();
  }
});

test('loopback guard, read-only methods, unknown paths', async () => {
  const h = await harness();
  try {
    const port = new URL(h.url).port;
    assert.is((await httpGet(`${h.url}/status`, { headers: { Host: 'rebound.example.com' } })).status, 403, 'a DNS-rebound name is refused');
    assert.is((await httpGet(`${h.url}/status`, { headers: { Host: `localhost:${port}` } })).status, 200);
    assert.is((await httpGet(`${h.url}/status`, { headers: { Host: `[::1]:${port}` } })).status, 200);
    const post = await httpGet(`${h.url}/status`, { method: 'POST' });
    assert.is(post.status, 405);
    assert.is(post.headers.allow, 'GET, HEAD');
    assert.is((await httpGet(`${h.url}/nope`)).status, 404);
    assert.match((await httpGet(`${h.url}/`)).body, /\/healthz/);
  } finally {
    await h.server.close();
  }
});

test('bound beyond loopback: a warning in the log, any Host served', async () => {
  const h = await harness('0.0.0.0');
  try {
    const warn = h.logLines.find((l) => l.level === 40);
    assert.ok(warn, 'a warning');
    assert.match(String(warn!.msg), /beyond loopback on 0\.0\.0\.0.*no authentication/);
    const port = new URL(h.url).port;
    assert.is((await httpGet(`http://127.0.0.1:${port}/healthz`, { headers: { Host: 'weightd.cluster.local' } })).status, 503);
  } finally {
    await h.server.close();
  }
});

test('events stream: history on connect, each event live with the status, ended on close', async () => {
  const h = await harness();
  h.toLoading();
  const stream = await SseStream.open(`${h.url}/events`);
  const hello = await stream.next((f) => f.event === 'hello');
  assert.is(hello.data.status.state, 'loading');
  assert.ok(hello.data.events.some((e: { type: string }) => e.type === 'GROUP_JOINED'), 'recent events replayed');
  h.toReady();
  const ready = await stream.next((f) => f.event === 'node-event' && f.data.event.state === 'ready');
  assert.is(ready.data.event.type, 'STARTUP_MODELS_SERVING');
  assert.is(ready.data.event.from, 'starting');
  assert.is(ready.data.status.state, 'ready', 'the status as of that event');
  const loaded = await stream.next((f) => f.event === 'node-event' && f.data.event.type === 'RANK_LOADED');
  assert.is(loaded.data.event.data.segments, 1);
  assert.not.ok(JSON.stringify(stream.frames).includes(HANDLE));
  await h.server.close();
  await stream.end();
  await httpGet(`${h.url}/healthz`).then(
    () => assert.unreachable('closed'),
    (err: NodeJS.ErrnoException) => assert.is(err.code, 'ECONNREFUSED'),
  );
});

test('a port in use is a UsageError naming the flag, before anything starts', async () => {
  const h = await harness();
  try {
    const port = Number(new URL(h.url).port);
    const feed = new EventFeed();
    const status = () => statusOf(h.actor.getSnapshot(), fakeConfig());
    const metrics = new NodeMetrics({ status, feed, states: () => [] });
    await InspectServer.listen({ host: '127.0.0.1', port, log: pino({ level: 'silent' }), status, feed, metrics, charts: [chart] }).then(
      () => assert.unreachable('bound twice'),
      (err: UsageError) => {
        assert.instance(err, UsageError);
        assert.is(err.code, 'E_INSPECT_BIND');
        assert.match(err.message, new RegExp(`--inspect-port ${port}: is in use`));
      },
    );
  } finally {
    await h.server.close();
  }
});

test('isLoopback', () => {
  for (const h of ['127.0.0.1', '127.1.2.3', 'localhost', 'LOCALHOST', 'a.localhost', '::1', '[::1]', '::ffff:127.0.0.1']) assert.ok(isLoopback(h), h);
  for (const h of ['0.0.0.0', '::', '10.0.0.1', 'example.com', 'localhost.example.com', '128.0.0.1']) assert.not.ok(isLoopback(h), h);
});

test.run();
