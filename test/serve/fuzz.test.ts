// Hostile input against a real daemon: 10,000 random, truncated, oversized, wrong-magic,
// wrong-version, non-JSON and schema-breaking frames, each on its own connection, plus slowloris
// and idle connections. Each must end only its own connection; afterwards the daemon still
// serves a real client, correctly, and has no descriptor left over.
import { connect, type Socket } from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient } from '../../src/client/index.js';
import { encodeFrame, encodeMessage, FRAME_HEADER_BYTES, MAX_REQUEST_BYTES } from '../../src/wire/frameCodec.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel } from '../helpers/paths.js';
import { runClient } from '../client/runClient.js';
import { expectedRank } from './checkpointOracle.js';

const FRAMES = Number(process.env.WEIGHTD_FUZZ_FRAMES ?? 10_000);
const PARALLEL = 64;
const READ_TIMEOUT_MS = 800;
const IDLE_TIMEOUT_MS = 1500;
/** One window for the whole run: its summary can only come from the flush at stop. */
const LOG_WINDOW_MS = 600_000;

/** Lines of `msg` (a regex over the JSON log's msg) and the sum of the limiter's summaries. */
function peerLog(stderr: string, msg: RegExp): { logged: number; dropped: number } {
  let logged = 0;
  let dropped = 0;
  for (const line of stderr.split('\n')) {
    if (!line.startsWith('{')) continue;
    const l = JSON.parse(line) as { msg?: string; dropped?: number };
    if (msg.test(l.msg ?? '')) logged++;
    else if (/more client protocol errors and refused connections were not logged$/.test(l.msg ?? '')) dropped += l.dropped ?? 0;
  }
  return { logged, dropped };
}

/** xorshift32: the same hostile inputs on every run, so a failure can be replayed. */
function rng(seed: number) {
  let x = seed >>> 0 || 1;
  const next = () => {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    return x;
  };
  return {
    int: (n: number) => next() % n,
    bytes: (n: number) => Buffer.from(Array.from({ length: n }, () => next() & 0xff)),
  };
}

function header(magic: string, version: number, length: number): Buffer {
  const h = Buffer.alloc(FRAME_HEADER_BYTES);
  h.write(magic, 0, 'latin1');
  h.writeUInt16BE(version, 4);
  h.writeUInt32BE(length >>> 0, 6);
  return h;
}

const valid = encodeMessage({ id: 7, cmd: 'ping' });

/** One hostile input; `kind` says which family it came from, for failure messages. */
function hostile(r: ReturnType<typeof rng>, i: number): { kind: string; bytes: Buffer } {
  switch (i % 10) {
    case 0:
      return { kind: 'random bytes', bytes: r.bytes(1 + r.int(300)) };
    case 1:
      return { kind: 'truncated frame', bytes: valid.subarray(0, r.int(valid.length)) };
    case 2:
      return { kind: 'oversized length', bytes: header('WGTD', 1, MAX_REQUEST_BYTES + 1 + r.int(2 ** 31)) };
    case 3:
      return { kind: 'wrong magic', bytes: Buffer.concat([header(['WGTE', 'GET ', '\0\0\0\0', 'wgtd'][r.int(4)]!, 1, 2), Buffer.from('{}')]) };
    case 4:
      return { kind: 'wrong version', bytes: Buffer.concat([header('WGTD', [0, 2, 255, 65535][r.int(4)]!, 2), Buffer.from('{}')]) };
    case 5:
      return { kind: 'not JSON', bytes: encodeFrameRaw(r.bytes(1 + r.int(200))) };
    case 6: {
      const bad = [
        { id: 1 },
        { cmd: 'ping' },
        { id: -1, cmd: 'ping' },
        { id: 'x', cmd: 'get_state' },
        { id: 1, cmd: 'get_state', fingerprint: 5, pid: 1, mode: 'map' },
        { id: 1, cmd: 'get_state', fingerprint: 'a', pid: 0, mode: 'map' },
        { id: 1, cmd: 'get_state', fingerprint: 'a', pid: 1, mode: 'steal' },
        { id: 1, cmd: 'get_state', fingerprint: 'x'.repeat(10_000), pid: 1, mode: 'map' },
        { id: 1, cmd: 'release', force: 'yes' },
        { id: 1, cmd: 'detach', leaseId: 12 },
        { id: 2 ** 60, cmd: 'stats' },
        [1, 2, 3],
        null,
        'ping',
        { id: 1, cmd: 'get_state', fingerprint: 'a', pid: 1, mode: 'map', fingerprintFields: { a: 1 } },
        { __proto__: { cmd: 'ping' }, id: 1 },
      ];
      return { kind: 'bad schema', bytes: encodeMessage(bad[r.int(bad.length)]) };
    }
    case 7:
      return { kind: 'deep nesting', bytes: encodeFrame('['.repeat(50_000) + ']'.repeat(50_000)) };
    case 8:
      return { kind: 'length larger than body', bytes: Buffer.concat([header('WGTD', 1, 100), Buffer.from('{"id":1,"cmd":"ping"}')]) };
    default:
      return { kind: 'valid frame then garbage', bytes: Buffer.concat([valid, r.bytes(1 + r.int(50))]) };
  }
}

function encodeFrameRaw(body: Buffer): Buffer {
  return Buffer.concat([header('WGTD', 1, body.length), body]);
}

/** Sends `bytes`, half-closes, and resolves when the daemon has closed the connection. */
function sendAndWaitClose(path: string, bytes: Buffer, kind: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`daemon did not close a connection that sent: ${kind}`));
    }, 10_000);
    s.on('error', () => {}); // EPIPE/ECONNRESET after the daemon hangs up is expected
    s.on('data', () => {});
    s.on('close', () => {
      clearTimeout(timer);
      resolve();
    });
    s.on('connect', () => s.end(bytes));
  });
}

function opened(path: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });
}

function closedWithin(s: Socket, ms: number): Promise<number> {
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`connection still open after ${ms} ms`)), ms);
    s.on('close', () => {
      clearTimeout(timer);
      resolve(Date.now() - started);
    });
  });
}

test(`${FRAMES} hostile frames, slowloris and idle connections end only their own connection`, async () => {
  const dir = makeTempDir('fuzz');
  const daemon = await startDaemon({
    model: exampleModel,
    socketDir: dir,
    env: { WEIGHTD_SERVE_READ_TIMEOUT_MS: String(READ_TIMEOUT_MS), WEIGHTD_SERVE_IDLE_TIMEOUT_MS: String(IDLE_TIMEOUT_MS), WEIGHTD_SERVE_LOG_WINDOW_MS: String(LOG_WINDOW_MS) },
  });
  try {
    const socket = await findSocket({ socketDir: dir, globalRank: 0 });
    const expected = await expectedFingerprint(exampleModel, 1, 0);
    // A client that stays connected through it all, attached, must be unaffected.
    const bystander = await WeightdClient.connect(socket);
    const attached = await bystander.attach(expected);
    if (attached.status !== 'attached') throw new Error('bystander could not attach');
    const fdsBefore = daemon.fdCount();

    const r = rng(0x5eed);
    let next = 0;
    await Promise.all(
      Array.from({ length: PARALLEL }, async () => {
        while (next < FRAMES) {
          const { kind, bytes } = hostile(r, next++);
          await sendAndWaitClose(socket, bytes, kind);
        }
      }),
    );

    // Slowloris: a frame trickled a byte at a time is cut off at the read deadline.
    const slow = await Promise.all(Array.from({ length: 16 }, () => opened(socket)));
    const closes = slow.map((s) => closedWithin(s, READ_TIMEOUT_MS * 4));
    const started = Date.now();
    let sent = 0;
    // Byte by byte, each one valid: the frame would be complete only after valid.length * 200 ms.
    const trickle = setInterval(() => {
      for (const s of slow) if (!s.destroyed) s.write(valid.subarray(sent, sent + 1));
      sent++;
    }, 200);
    const slowMs = await Promise.all(closes);
    clearInterval(trickle);
    // The clock starts at the first byte (200 ms in): never earlier than the deadline, and not
    // reset by later bytes, so the cut comes before the frame is complete. (How much later than
    // the deadline is up to the scheduler, so only the byte count bounds it.)
    for (const ms of slowMs) assert.ok(ms >= 200 + READ_TIMEOUT_MS - 50, `slowloris cut after ${ms} ms`);
    assert.ok(sent < valid.length, `cut before the frame was complete (${sent} of ${valid.length} bytes, ${Date.now() - started} ms)`);

    // Idle connections are closed after the idle timeout.
    const idle = await opened(socket);
    const idleMs = await closedWithin(idle, IDLE_TIMEOUT_MS * 4);
    assert.ok(idleMs >= IDLE_TIMEOUT_MS - 100, `idle closed after ${idleMs} ms`);

    // Pipelined requests on one connection are all answered, in order; an unknown command gets
    // an error reply and the connection stays usable (a newer client falls back).
    const pipelined = await opened(socket);
    const replies: Array<{ id: number; ok: boolean; error?: { code: string } }> = [];
    let buf = Buffer.alloc(0);
    await new Promise<void>((resolve) => {
      pipelined.on('data', (d: Buffer) => {
        buf = Buffer.concat([buf, d]);
        while (buf.length >= FRAME_HEADER_BYTES && buf.length >= FRAME_HEADER_BYTES + buf.readUInt32BE(6)) {
          const len = buf.readUInt32BE(6);
          replies.push(JSON.parse(buf.subarray(FRAME_HEADER_BYTES, FRAME_HEADER_BYTES + len).toString()) as (typeof replies)[number]);
          buf = buf.subarray(FRAME_HEADER_BYTES + len);
        }
        if (replies.length === 200) resolve();
      });
      const cmd = (i: number) => (i % 10 === 9 ? 'frobnicate' : i % 2 ? 'stats' : 'ping');
      pipelined.write(Buffer.concat(Array.from({ length: 200 }, (_, i) => encodeMessage({ id: i, cmd: cmd(i) }))));
    });
    assert.equal(replies.map((x) => x.id), Array.from({ length: 200 }, (_, i) => i));
    for (const x of replies) assert.is(x.ok, x.id % 10 !== 9, `reply ${x.id}`);
    assert.is(replies[9]!.error!.code, 'E_UNKNOWN_COMMAND');
    pipelined.destroy();

    // Still serving, correctly, to a fresh client process.
    const got = await runClient<{ tensors: Record<string, { sha256: string }> }>('ts', 'hashes', socket, expected, 'map');
    for (const [name, want] of expectedRank(exampleModel, 1, 0)) assert.is(got.tensors[name]!.sha256, want.sha256, name);

    const stats = await bystander.stats();
    assert.ok(stats.protocolErrors >= FRAMES * 0.8, `protocol errors counted: ${stats.protocolErrors}`);
    assert.is(stats.leases.length, 1, "only the bystander's lease");
    await attached.detach();
    assert.is((await bystander.stats()).leases.length, 0);
    // Once the daemon has closed every other connection (their fds close before 'close' is
    // emitted), its descriptors are back to where they were.
    while ((await bystander.stats()).connections > 1) await new Promise((r) => setImmediate(r));
    assert.ok(daemon.fdCount() <= fdsBefore, `daemon fds ${fdsBefore} -> ${daemon.fdCount()}`);
    const { protocolErrors } = await bystander.stats();
    bystander.close();
    // Every protocol error is in the log: the window's 20 lines, then the count of the rest,
    // written when the daemon stops (the window-end flush is logLimiter.test's).
    assert.equal(await daemon.stop(), { code: 0, signal: null });
    const { logged, dropped } = peerLog(daemon.stderr(), /^closed a client connection: /);
    assert.equal([logged, dropped], [20, protocolErrors - 20]);
  } finally {
    await daemon.stop();
    removeDir(dir);
  }
});

test('connections refused at the cap are rate-limited in the log, with the same limiter', async () => {
  const dir = makeTempDir('fuzz-cap');
  const daemon = await startDaemon({
    model: exampleModel,
    socketDir: dir,
    // One window for the whole test: its summary can only come from the flush at stop.
    env: { WEIGHTD_SERVE_MAX_CONNECTIONS: '2', WEIGHTD_SERVE_LOG_WINDOW_MS: '600000' },
  });
  try {
    const socket = await findSocket({ socketDir: dir, globalRank: 0 });
    const held = await Promise.all([opened(socket), opened(socket)]);
    const REFUSED = 500;
    for (let i = 0; i < REFUSED; i += 50) {
      await Promise.all(Array.from({ length: 50 }, () => sendAndWaitClose(socket, Buffer.alloc(0), 'a connection over the cap')));
    }
    for (const s of held) s.destroy();
    assert.equal(await daemon.stop(), { code: 0, signal: null });
    const { logged, dropped } = peerLog(daemon.stderr(), /^too many client connections: refused one$/);
    assert.equal([logged, dropped], [20, REFUSED - 20]);
  } finally {
    await daemon.stop();
    removeDir(dir);
  }
});

test.run();
