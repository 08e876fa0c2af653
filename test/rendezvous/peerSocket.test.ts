// The peer timeout judges only real silence: when this thread itself was stalled longer than the
// timeout, heartbeats that arrived meanwhile are read before the verdict, so a busy machine's
// scheduler cannot make a healthy peer look lost.
import { createServer, connect, type Socket } from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parsePayload } from '../../src/wire/frameCodec.js';
import { PeerSocket } from '../../src/rendezvous/peerSocket.js';

const timing = { heartbeatMs: 50, peerTimeoutMs: 200 };

test('a stall of this thread longer than the peer timeout does not lose a peer whose heartbeats are waiting', async () => {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const accepted = new Promise<Socket>((r) => server.once('connection', r));
  const outgoing = connect((server.address() as { port: number }).port, '127.0.0.1');
  await new Promise((r) => outgoing.once('connect', r));
  const closes: string[] = [];
  let heard = 0;
  let onHeard = () => {};
  let onClosed = () => {};
  const peer = (s: Socket, name: string) =>
    new PeerSocket(s, {
      parse: (p) => parsePayload(p) as { type: string },
      timing,
      onMessage: () => (heard++, onHeard()),
      onClose: (reason) => (closes.push(`${name}: ${reason}`), onClosed()),
    });
  const a = peer(outgoing, 'a');
  const b = peer(await accepted, 'b');
  try {
    // Each side's heartbeat is in the kernel before this thread stalls (small writes are
    // written at once), as a live peer's would be.
    void a.send({ type: 'heartbeat' });
    void b.send({ type: 'heartbeat' });
    const until = performance.now() + timing.peerTimeoutMs * 2;
    while (performance.now() < until) {
      // The stall: no timer, no I/O.
    }
    // Both ends keep hearing each other's heartbeats afterwards, and neither was judged lost.
    const target = heard + 6;
    await new Promise<void>((resolve) => {
      onHeard = () => heard >= target && resolve();
      onClosed = resolve;
      if (closes.length > 0) resolve();
    });
    assert.equal(closes, []);
  } finally {
    a.destroy('test over');
    b.destroy('test over');
    server.close();
  }
});

test('real silence past the peer timeout still loses the peer', async () => {
  const server = createServer((s) => s.on('data', () => {})); // accepts, never speaks
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const s = connect((server.address() as { port: number }).port, '127.0.0.1');
  await new Promise((r) => s.once('connect', r));
  const reason = await new Promise<string>((resolve) => {
    new PeerSocket(s, { parse: (p) => parsePayload(p), timing, onMessage: () => {}, onClose: resolve });
  });
  assert.match(reason, /^no message for \d+ ms \(peer timeout 200 ms\)/);
  server.close();
});

test.run();
