// Load progress: rates and ETAs from the ranks' counters, a periodic log line while loading, a
// summary per rank and for the node, and a bar on a terminal that never wraps and is cleared.
import { Writable } from 'node:stream';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor } from 'xstate';
import { EventFeed } from '../../src/inspect/eventFeed.js';
import { formatBytes, formatRate, formatSeconds, nodeProgress, rankProgress } from '../../src/inspect/loadProgress.js';
import { ProgressReporter, renderProgressBar } from '../../src/inspect/progressReporter.js';
import type { RankStatus } from '../../src/nodeStatus.js';
import { supervisorMachine } from '../../src/machines/supervisor.js';
import { statusOf } from '../../src/startNode.js';
import { FIRST_MODEL_ID } from '../../src/models/modelHost.js';
import { FakeWorld, sendToNode, fakeConfig, fakeInput, fakePrepared, fakeRankTable } from '../helpers/fakeNode.js';

type Ev = Parameters<ReturnType<typeof createActor<typeof supervisorMachine>>['send']>[0];
const device = (r: number) => ({ backend: 'host' as const, index: r, uuid: `fake-${r}`, name: 'fake', totalBytes: 1 << 30, freeBytes: 1 << 30 });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const rank = (over: Partial<RankStatus>): RankStatus => ({ localRank: 0, globalRank: 0, state: 'loading', bytes: 0, totalBytes: 0, seconds: 0, ...over });

test('rate and ETA of a rank and of the node', () => {
  const a = rank({ bytes: 4e9, totalBytes: 10e9, seconds: 2 });
  assert.equal(rankProgress(a), { bytes: 4e9, totalBytes: 10e9, seconds: 2, bytesPerSecond: 2e9, etaSeconds: 3 });
  const b = rank({ localRank: 1, globalRank: 1, bytes: 8e9, totalBytes: 10e9, seconds: 1 });
  // Side by side: 12 GB in the longest rank's 2 s; done when the slower rank (3 s left) is.
  assert.equal(nodeProgress([a, b]), { bytes: 12e9, totalBytes: 20e9, seconds: 2, bytesPerSecond: 6e9, etaSeconds: 3 });
  assert.equal(rankProgress(rank({ totalBytes: 10 })).etaSeconds, null, 'no rate before the first byte');
  assert.is(rankProgress(rank({ state: 'starting', totalBytes: 10 })).bytesPerSecond, null);
  assert.is(rankProgress(rank({ state: 'serving', bytes: 10, totalBytes: 10, seconds: 1 })).etaSeconds, 0);
  assert.is(rankProgress(rank({ state: 'failed', bytes: 5, totalBytes: 10, seconds: 1 })).etaSeconds, null);
  assert.is(nodeProgress([a, rank({ localRank: 1, state: 'starting', totalBytes: 5 })]).etaSeconds, null, 'unknown while any rank is');
  assert.equal(nodeProgress([]), { bytes: 0, totalBytes: 0, seconds: 0, bytesPerSecond: null, etaSeconds: null });
});

test('units', () => {
  assert.is(formatBytes(999), '999 B');
  assert.is(formatBytes(5_001_728), '5.0 MB');
  assert.is(formatBytes(27e9), '27.00 GB');
  assert.is(formatRate(6.2e9), '6.20 GB/s');
  assert.is(formatRate(3e7), '30.0 MB/s');
  assert.is(formatRate(null), '? GB/s');
  assert.is(formatSeconds(0.0123), '12 ms');
  assert.is(formatSeconds(2.44), '2.4 s');
  assert.is(formatSeconds(179.7), '3 min 0 s');
  assert.is(formatSeconds(null), '?');
});

test('the bar fits the terminal at any width', () => {
  const p = { bytes: 5e9, totalBytes: 10e9, seconds: 1, bytesPerSecond: 5e9, etaSeconds: 1 };
  for (const columns of [20, 60, 80, 200]) {
    const line = renderProgressBar(p, columns);
    assert.ok(line.length <= columns - 1, `${columns} columns: ${JSON.stringify(line)}`);
  }
  assert.is(renderProgressBar(p, 200), `loading [${'█'.repeat(20)}${'░'.repeat(20)}]  50%  5.00 GB / 10.00 GB  5.00 GB/s  eta 1.0 s`);
});

function harness() {
  const lines: Array<Record<string, unknown>> = [];
  const log = pino({ level: 'info' }, new Writable({ write(chunk, _enc, cb) { lines.push(JSON.parse(String(chunk))); cb(); } }));
  const feed = new EventFeed();
  const world = new FakeWorld();
  const actor = createActor(supervisorMachine.provide(world.implementations()), { input: fakeInput(), inspect: feed.inspect });
  actor.start();
  const send = (e: unknown) => sendToNode(actor, e as Ev);
  const writes: string[] = [];
  const bar = { columns: 80, write: (s: string) => writes.push(s) };
  const reporter = new ProgressReporter({ log, status: () => statusOf(actor.getSnapshot(), fakeConfig()), feed, model: FIRST_MODEL_ID, intervalMs: 100, bar });
  return { lines, send, writes, reporter, actor };
}

test('log lines while loading, a summary per rank and for the node, and a bar that is cleared', async () => {
  const { lines, send, writes, reporter } = harness();
  try {
    send({ type: 'xstate.done.actor.prepare', output: fakePrepared });
    send({ type: 'GROUP_JOINED', rankTable: fakeRankTable });
    await sleep(250);
    assert.equal(lines, [], 'nothing while no rank loads');
    assert.equal(writes, []);
    for (const r of [0, 1]) send({ type: 'RANK_DEVICE', localRank: r, info: device(r) });
    send({ type: 'RANK_PROGRESS', localRank: 0, bytes: 128, totalBytes: 256, seconds: 1, waitingForGroup: false });
    send({ type: 'RANK_PROGRESS', localRank: 1, bytes: 64, totalBytes: 256, seconds: 1, waitingForGroup: false });
    await sleep(260);
    const tick = lines.find((l) => String(l.msg).startsWith('loading'));
    assert.ok(tick, `a periodic line: ${JSON.stringify(lines)}`);
    assert.is(tick!.msg, 'loading 37.5%: 192 B of 512 B at 192 B/s, eta 3.0 s; slowest rank 1 at 25.0%');
    assert.equal(tick!.bytes, 192);
    assert.equal(tick!.etaSeconds, 3);
    assert.equal((tick!.ranks as Array<{ globalRank: number; etaSeconds: number }>).map((r) => [r.globalRank, r.etaSeconds]), [[0, 1], [1, 3]]);
    lines.length = 0;
    send({ type: 'RANK_PROGRESS', localRank: 0, bytes: 256, totalBytes: 256, seconds: 1.5, waitingForGroup: true });
    await sleep(260);
    const waiting = lines.find((l) => String(l.msg).startsWith('loading'));
    assert.is(waiting?.msg, "loading 62.5%: 320 B of 512 B at 213 B/s, eta 3.0 s; slowest rank 1 at 25.0%; rank 0 waiting for the node's other ranks");
    const drawn = writes.filter((w) => w.includes('loading ['));
    assert.ok(drawn.length > 0, 'the bar was drawn');
    for (const w of drawn) {
      assert.ok(w.startsWith('\r\x1b[K') && w.endsWith('\r'), 'drawn in place');
      assert.ok(w.length - '\r\x1b[K\r'.length <= 79, 'never wraps');
    }
    lines.length = 0;
    for (const r of [0, 1]) send({ type: 'RANK_LOADED', localRank: r, device: device(r), segments: [], bytes: 256, seconds: 0.5, source: { from: 'checkpoint' } });
    assert.equal(lines.map((l) => l.msg), ['rank 0 loaded 256 B in 500 ms (512 B/s)', 'rank 1 loaded 256 B in 500 ms (512 B/s)', 'all 2 local ranks loaded: 512 B in 500 ms (1.0 kB/s)']);
    assert.equal([lines[0]!.globalRank, lines[0]!.bytesPerSecond], [0, 512]);
    assert.is(writes.at(-1), '\r\x1b[K', 'the bar is gone once loaded');
    const count = writes.length;
    await sleep(300);
    assert.is(writes.length, count, 'no bar after loading');
  } finally {
    reporter.stop();
  }
});

// The bar is redrawn every 200 ms and a log line comes every 100 ms: by the third line the
// bar's timer has fired at least once (timers run in order of their due time).
async function writesByThirdTick(columns: number | undefined): Promise<string[]> {
  const ticks: string[] = [];
  let third!: () => void;
  const thirdTick = new Promise<void>((resolve) => (third = resolve));
  const log = pino({ level: 'info' }, new Writable({ write(chunk, _enc, cb) { const m = String(JSON.parse(String(chunk)).msg); if (m.startsWith('loading') && ticks.push(m) === 3) third(); cb(); } }));
  const feed = new EventFeed();
  const actor = createActor(supervisorMachine.provide(new FakeWorld().implementations()), { input: fakeInput(), inspect: feed.inspect });
  actor.start();
  const send = (e: unknown) => sendToNode(actor, e as Ev);
  const writes: string[] = [];
  const reporter = new ProgressReporter({ log, status: () => statusOf(actor.getSnapshot(), fakeConfig()), feed, model: FIRST_MODEL_ID, intervalMs: 100, bar: { columns, write: (s: string) => writes.push(s) } });
  try {
    send({ type: 'xstate.done.actor.prepare', output: fakePrepared });
    send({ type: 'GROUP_JOINED', rankTable: fakeRankTable });
    for (const r of [0, 1]) send({ type: 'RANK_DEVICE', localRank: r, info: device(r) });
    send({ type: 'RANK_PROGRESS', localRank: 0, bytes: 1, totalBytes: 256, seconds: 1 });
    // The reporter's timers are unref'd; this one keeps the test alive (and bounds the wait).
    const guard = setTimeout(() => third(), 20_000);
    await thirdTick;
    clearTimeout(guard);
    assert.is(ticks.length, 3, 'three progress lines came');
    return writes;
  } finally {
    reporter.stop();
    actor.stop();
  }
}

test('a terminal with no size set (0 columns) gets log lines and no bar', async () => {
  assert.ok((await writesByThirdTick(80)).some((w) => w.includes('loading [')), 'a sized terminal gets the bar');
  assert.equal(await writesByThirdTick(0), [], 'no bar at 0 columns');
  assert.equal(await writesByThirdTick(undefined), [], 'no bar when the width is unknown');
});

test('stop() ends all output', async () => {
  const { lines, send, writes, reporter } = harness();
  send({ type: 'xstate.done.actor.prepare', output: fakePrepared });
  send({ type: 'GROUP_JOINED', rankTable: fakeRankTable });
  for (const r of [0, 1]) send({ type: 'RANK_DEVICE', localRank: r, info: device(r) });
  send({ type: 'RANK_PROGRESS', localRank: 0, bytes: 1, totalBytes: 256, seconds: 1 });
  await sleep(250);
  reporter.stop();
  assert.is(writes.at(-1), '\r\x1b[K', 'stop clears a bar on screen');
  const [l, w] = [lines.length, writes.length];
  await sleep(250);
  assert.equal([lines.length, writes.length], [l, w]);
});

test.run();
