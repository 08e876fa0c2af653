// Connection deadlines: a client that never takes its reply is cut off, a request that is slow to
// serve does not count against the next frame's read deadline, and a request that crosses its
// read deadline can still be sent and its refusal read.
import { closeSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import { createConnection, createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ClientConnection, type ConnectionHandler } from '../../src/serve/clientConnection.js';
import { encodeFrame, encodeMessage, FrameDecoder } from '../../src/wire/frameCodec.js';
import type { Request } from '../../src/wire/protocol.js';
import { crossReadDeadline } from '../helpers/crossingPeer.js';
import { socketFdWriter, type FdWriter } from '../../src/wire/socketFdWriter.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A server whose one connection uses `handler` (and `fdWriter`, made from its socket, for replies
 * with descriptors); resolves to the client socket, the connection, and a close promise.
 */
async function serve(handler: Partial<ConnectionHandler>, limits: { readTimeoutMs: number; idleTimeoutMs: number }, fdWriter?: (socket: Socket) => FdWriter) {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-conn-'));
  const path = join(dir, 's.sock');
  let serverClosed!: () => void;
  const closed = new Promise<void>((r) => (serverClosed = r));
  const violations: string[] = [];
  let connection: ClientConnection | undefined;
  const server = createServer((socket: Socket) => {
    connection = new ClientConnection(socket, { pid: 1, connectionId: 1 }, {
      handle: async () => '{}',
      keepOpen: () => false,
      closed: () => serverClosed(),
      violation: (_c, err) => violations.push(err.code),
      ...handler,
    }, { maxRequestBytes: 1 << 20, eventReadTimeoutMs: 60_000, ...limits }, fdWriter?.(socket));
  });
  await new Promise<void>((r) => server.listen(path, r));
  const client = createConnection(path);
  await new Promise((r) => client.once('connect', r));
  return { client, path, closed, violations, connection: () => connection!, cleanup: () => (client.destroy(), server.close(), rmSync(dir, { recursive: true, force: true })) };
}

test('a client that never reads its (large) reply is disconnected after the idle timeout', async () => {
  const big = JSON.stringify({ id: 1, ok: true, pad: 'x'.repeat(16 << 20) });
  const s = await serve({ handle: async () => big }, { readTimeoutMs: 5000, idleTimeoutMs: 300 });
  try {
    s.client.pause(); // never reads
    const t0 = Date.now();
    s.client.write(encodeMessage({ id: 1, cmd: 'ping' }));
    await s.closed; // the server gave up on the reply (uvu's own timeout catches a hang)
    assert.ok(Date.now() - t0 >= 300, 'not before the idle timeout');
  } finally {
    s.cleanup();
  }
});

test('a slow request does not eat the read deadline of a pipelined frame that arrived in part', async () => {
  const seen: number[] = [];
  let servingFirst!: () => void;
  const firstStarted = new Promise<void>((r) => (servingFirst = r));
  const s = await serve(
    {
      handle: async (req: Request) => {
        seen.push(req.id);
        if (req.id === 1) servingFirst();
        if (req.id === 1) await sleep(700); // slower than the read deadline
        return JSON.stringify({ id: req.id, ok: true, status: 'ok' });
      },
    },
    { readTimeoutMs: 250, idleTimeoutMs: 5000 },
  );
  try {
    const second = encodeMessage({ id: 2, cmd: 'ping' });
    // Request 1 whole and the first bytes of request 2 in one write; the rest while request 1
    // is being served.
    s.client.write(Buffer.concat([encodeMessage({ id: 1, cmd: 'ping' }), second.subarray(0, 6)]));
    await firstStarted;
    s.client.write(second.subarray(6));
    const decoder = new FrameDecoder(1 << 20);
    const replies: number[] = [];
    await new Promise<void>((resolve, reject) => {
      s.client.on('data', (chunk: Buffer) => {
        for (const f of decoder.push(chunk)) replies.push((JSON.parse(f.toString()) as { id: number }).id);
        if (replies.length === 2) resolve();
      });
      s.client.once('close', () => reject(new Error(`closed after replies ${replies}; violations ${s.violations}`)));
      setTimeout(() => reject(new Error('timeout')), 4000);
    });
    assert.equal(replies, [1, 2]);
    assert.equal(s.violations, []);
  } finally {
    s.cleanup();
  }
});

test('an event fired while a reply with descriptors waits for the stream to drain comes after that reply, every frame whole', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-conn-'));
  const path = join(dir, 's.sock');
  const fd = openSync('/dev/null', 'r');
  let conn!: ClientConnection;
  let notified!: () => void;
  const eventFired = new Promise<void>((r) => (notified = r));
  // 44 events of 8 KiB that the paused client leaves unread: past what the kernel buffers, so
  // some wait in the stream's queue, and the reply with a descriptor waits for them to drain.
  const PAD_EVENTS = 44;
  const server = createServer((socket: Socket) => {
    conn = new ClientConnection(socket, { pid: 1, connectionId: 1 }, {
      handle: async () => {
        for (let i = 0; i < PAD_EVENTS; i++) conn.notify(JSON.stringify({ id: null, ok: true, event: `pad-${i}`, pad: 'x'.repeat(8 << 10) }));
        // Once the reply is on its way, waiting for those to drain.
        setImmediate(() => (conn.notify(JSON.stringify({ id: null, ok: true, event: 'model_ready' })), notified()));
        return { json: JSON.stringify({ id: 1, ok: true }), fds: [fd], sent: () => {} };
      },
      keepOpen: () => false,
      closed: () => {},
      violation: () => {},
    }, { maxRequestBytes: 1 << 20, eventReadTimeoutMs: 60_000, readTimeoutMs: 5000, idleTimeoutMs: 10_000 });
  });
  await new Promise<void>((r) => server.listen(path, r));
  const client = createConnection(path);
  try {
    await new Promise((r) => client.once('connect', r));
    client.pause();
    client.write(encodeMessage({ id: 1, cmd: 'ping' }));
    await eventFired;
    const decoder = new FrameDecoder(1 << 20);
    const frames: Array<number | string | null> = [];
    await new Promise<void>((resolve, reject) => {
      client.on('data', (chunk: Buffer) => {
        try {
          for (const f of decoder.push(chunk)) {
            const m = JSON.parse(f.toString()) as { id: number | null; event?: string };
            frames.push(m.event ?? m.id);
          }
        } catch (err) {
          reject(err as Error);
        }
        if (frames.length === PAD_EVENTS + 2) resolve();
      });
      client.resume();
    });
    assert.equal(frames.slice(PAD_EVENTS), [1, 'model_ready']);
    assert.equal(frames.slice(0, PAD_EVENTS), Array.from({ length: PAD_EVENTS }, (_, i) => `pad-${i}`));
  } finally {
    client.destroy();
    server.close();
    closeSync(fd);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a connection closed by the daemon while its reply with descriptors waits for a peer that does not read ends at once: the peer reads the end, the reply is let go, the peer is not blamed', async () => {
  const fd = openSync('/dev/null', 'r');
  let replyPending!: () => void;
  const pending = new Promise<void>((r) => (replyPending = r));
  let sent = 0;
  // 4 MiB: far more than the socket buffers, so the send waits for the peer after its first try.
  const json = JSON.stringify({ id: 1, ok: true, pad: 'x'.repeat(4 << 20) });
  const s = await serve({ handle: async () => ({ json, fds: [fd], sent: () => void sent++ }) }, { readTimeoutMs: 5000, idleTimeoutMs: 60_000 }, (socket) => {
    const writer = socketFdWriter(socket);
    return (frame, fds, timeoutMs, signal) => {
      const sending = writer(frame, fds, timeoutMs, signal);
      replyPending(); // the first try has returned: the rest waits for the peer
      return sending;
    };
  });
  try {
    s.client.pause();
    s.client.write(encodeMessage({ id: 1, cmd: 'ping' }));
    await pending;
    s.connection().destroy(); // as the daemon's stop does
    let got = 0;
    await new Promise<void>((resolve) => {
      s.client.on('data', (chunk: Buffer) => (got += chunk.length));
      s.client.on('close', () => resolve());
      s.client.resume();
    });
    // Before, the close waited for the whole reply (or its 60 s deadline) on the kept descriptor.
    assert.ok(got < encodeFrame(json).length, `the reply was cut off at the close (${got} bytes read)`);
    assert.is(sent, 1, "the reply's descriptors are let go");
    assert.equal(s.violations, [], 'a close by the daemon is no violation of the peer');
  } finally {
    s.cleanup();
    closeSync(fd);
  }
});

test('valid requests followed by garbage in one write are each answered, then the error', async () => {
  const s = await serve({ handle: async (req: Request) => JSON.stringify({ id: req.id, ok: true }) }, { readTimeoutMs: 5000, idleTimeoutMs: 5000 });
  try {
    const decoder = new FrameDecoder(1 << 20);
    const replies: Array<{ id: number | null; ok: boolean; error?: { code: string } }> = [];
    s.client.on('data', (chunk: Buffer) => {
      for (const f of decoder.push(chunk)) replies.push(JSON.parse(f.toString()) as (typeof replies)[number]);
    });
    const clientClosed = new Promise((r) => s.client.once('close', r));
    s.client.write(Buffer.concat([encodeMessage({ id: 1, cmd: 'ping' }), encodeMessage({ id: 2, cmd: 'stats' }), Buffer.from('not a frame')]));
    await clientClosed;
    assert.equal(replies.map((r) => [r.id, r.ok, r.error?.code]), [[1, true, undefined], [2, true, undefined], [null, false, 'E_FRAME_MAGIC']]);
    assert.equal(s.violations, ['E_FRAME_MAGIC']);
  } finally {
    s.cleanup();
  }
});

test('a request of brackets nested past 128 levels is refused before JSON.parse runs', async () => {
  const s = await serve({}, { readTimeoutMs: 5000, idleTimeoutMs: 5000 });
  try {
    const replies: Buffer[] = [];
    const decoder = new FrameDecoder(1 << 20);
    s.client.on('data', (d: Buffer) => replies.push(...decoder.push(d)));
    const ended = new Promise((r) => s.client.once('end', r));
    // Balanced, so that the old plain JSON.parse would have parsed all of it (~0.2 s a MiB).
    const depth = (1 << 19) - 8;
    s.client.write(encodeFrame(`${'['.repeat(depth)}${']'.repeat(depth)}`));
    await Promise.all([s.closed, ended]);
    assert.equal(s.violations, ['E_FRAME_JSON']);
    const reply = JSON.parse(replies[0]!.toString()) as { error: { code: string; message: string } };
    assert.is(reply.error.code, 'E_FRAME_JSON');
    assert.match(reply.error.message, /nested 128 levels deep at position 127/);
  } finally {
    s.cleanup();
  }
});

test('a request that crosses the read deadline can still be sent, and its peer reads E_READ_TIMEOUT', async () => {
  const served: number[] = [];
  const s = await serve({ handle: async (req: Request) => (served.push(req.id), JSON.stringify({ id: req.id, ok: true })) }, { readTimeoutMs: 50, idleTimeoutMs: 5000 });
  try {
    assert.is(await crossReadDeadline(s.path, encodeMessage({ id: 1, cmd: 'ping' })), 'sent\nE_READ_TIMEOUT\n');
    assert.equal(served, [], 'a request completed after its deadline is not served');
  } finally {
    s.cleanup();
  }
});

test.run();
