// A connection that hears events (a watch's, lease_revoked) is never idle-closed, so it must read
// them: one that leaves them unread past the event read deadline, or lets them pile up in the
// daemon's buffer behind a full socket, is dropped with E_EVENTS_NOT_READ; one that reads them,
// however late within the deadline, is kept. Real Unix sockets: what the peer has not read is
// the kernel's count (SIOCOUTQ), which an in-memory pair does not have.
import { mkdtempSync, rmSync } from 'node:fs';
import { createConnection, createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ClientConnection, MAX_EVENT_BACKLOG_BYTES } from '../../src/serve/clientConnection.js';
import { FrameDecoder } from '../../src/wire/frameCodec.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const event = (n: number, pad = 0) => JSON.stringify({ id: null, ok: true, event: 'model_ready', model: 'tiny', fingerprint: `fp-${n}`, version: n, ...(pad ? { pad: 'x'.repeat(pad) } : {}) });

/** One kept-open connection (as a watcher's) with event read deadline `eventReadTimeoutMs`; the test calls notify() on it. */
async function watcher(eventReadTimeoutMs: number) {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-events-'));
  const path = join(dir, 's.sock');
  let closed = false;
  const violations: Array<{ code: string; message: string; details: Record<string, unknown> }> = [];
  let accept!: (c: ClientConnection) => void;
  const accepted = new Promise<ClientConnection>((resolve) => (accept = resolve));
  const server = createServer((socket: Socket) => {
    accept(new ClientConnection(socket, { pid: 1, connectionId: 1 }, {
      handle: async () => '{}',
      keepOpen: () => true,
      closed: () => (closed = true),
      violation: (_c, err) => violations.push({ code: err.code, message: err.message, details: err.details }),
    }, { maxRequestBytes: 1 << 20, readTimeoutMs: 5_000, idleTimeoutMs: 60_000, eventReadTimeoutMs }));
  });
  await new Promise<void>((r) => server.listen(path, r));
  const events: string[] = [];
  const decoder = new FrameDecoder(16 << 20);
  // onread: pause() stops reading from the kernel (readStop), so what the peer has read is
  // exactly what came in the windows read() opens.
  const client = createConnection({
    path,
    onread: {
      buffer: Buffer.alloc(64 << 10),
      callback: (n: number, buf: Uint8Array) => {
        for (const f of decoder.push(Buffer.from(buf.subarray(0, n)))) events.push((JSON.parse(f.toString()) as { fingerprint?: string }).fingerprint ?? 'error');
        return true;
      },
    },
  });
  client.pause();
  const connection = await accepted;
  const cleanups = [() => client.destroy(), () => server.close(), () => rmSync(dir, { recursive: true, force: true })];
  /** Reads what has come, for a moment. */
  const read = async () => {
    client.resume();
    await sleep(30);
    client.pause();
  };
  return { connection, client, events, violations, read, isClosed: () => closed, cleanup: () => cleanups.forEach((c) => c()) };
}

test('a watcher that never reads its event is dropped once the event read deadline passes, saying why', async () => {
  const w = await watcher(300);
  try {
    w.connection.notify(event(1));
    await sleep(150);
    assert.is(w.isClosed(), false, 'not before the deadline');
    const t0 = Date.now();
    while (!w.isClosed() && Date.now() - t0 < 3_000) await sleep(20);
    assert.is(w.isClosed(), true, 'a peer that leaves one small event unread for ever is dropped (it fits the kernel buffer: nothing else would notice)');
    assert.is(w.violations.length, 1);
    assert.is(w.violations[0]!.code, 'E_EVENTS_NOT_READ');
    assert.match(w.violations[0]!.message, /left events unread for \d+ ms, longer than the 300 ms a connection may \(WEIGHTD_SERVE_EVENT_READ_TIMEOUT_MS\); read events as they come/);
  } finally {
    w.cleanup();
  }
});

test('a watcher that reads its events, each within the deadline though never at once, is kept', async () => {
  const w = await watcher(400);
  try {
    for (let n = 1; n <= 8; n++) {
      w.connection.notify(event(n));
      await sleep(150);
      // Reads every other round: its oldest unread event is then 300 ms old, within the deadline.
      if (n % 2 === 0) await w.read();
    }
    await sleep(600);
    assert.is(w.isClosed(), false);
    assert.equal(w.violations, []);
    assert.equal(w.events, [1, 2, 3, 4, 5, 6, 7, 8].map((n) => `fp-${n}`));
  } finally {
    w.cleanup();
  }
});

test('events that pile up in the daemon behind a peer\'s full socket buffer are bounded: past the bound the watcher is dropped at once', async () => {
  const w = await watcher(60_000);
  try {
    let sent = 0;
    // 16 KiB events: the kernel's buffer (about 200 KiB) fills, then the daemon's own.
    while (w.violations.length === 0 && sent < 1000) {
      w.connection.notify(event(++sent, 16 << 10));
      if (sent % 8 === 0) await sleep(1);
    }
    assert.is(w.violations.length, 1, `dropped after ${sent} events`);
    assert.ok(sent * (16 << 10) < 4 * MAX_EVENT_BACKLOG_BYTES, `dropped within the bound and the kernel's buffer, after ${sent} events`);
    assert.is(w.violations[0]!.code, 'E_EVENTS_NOT_READ');
    assert.match(w.violations[0]!.message, new RegExp(`bytes of replies and events wait for this connection behind its full socket buffer, more than the ${MAX_EVENT_BACKLOG_BYTES} one may leave unread`));
    assert.is(w.violations[0]!.details.limit, MAX_EVENT_BACKLOG_BYTES);
  } finally {
    w.cleanup();
  }
});

test.run();
