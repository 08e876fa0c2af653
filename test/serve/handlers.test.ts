// Every command's handler, driven through the dispatch table and a real ClientConnection's
// framing over an in-memory duplex pair (no socket, no addon memory), as aedes' test/helper.js
// feeds its broker: the replies, the lease rules and the serving -> releasing -> released
// lifecycle as a client sees them. rankServiceActor.test.ts and fuzz.test.ts keep the real sockets
// (segmentFds.test.ts the real descriptors): here a reply's descriptors are only recorded.
import { renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { encodeMessage, FrameDecoder, MAX_RESPONSE_BYTES } from '../../src/wire/frameCodec.js';
import { fromPacked } from '../../src/wire/packedManifest.js';
import { PROTOCOL_VERSION } from '../../src/wire/protocol.js';
import { MAX_WATCHES_PER_CONNECTION } from '../../src/serve/watchTable.js';
import { DEFAULT_SERVE_LIMITS } from '../../src/serve/serveLimits.js';
import { fileIdentities } from '../../src/files/fileIdentity.js';
import { FilesCheck } from '../../src/serve/filesCheck.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { afterCtimeOf } from '../helpers/fileClock.js';
import { oneRankServer, type OneRankServer } from './oneRankServer.js';
import type { ServedRankData } from '../../src/serve/servedRankData.js';
import { duplexPair } from './duplexPair.js';

const log = pino({ level: 'silent' });
const tensors = [{ name: 'w', dtype: 'F32' as const, shape: [4], segment: 0, offset: 0, bytes: 16 }];

/** Plain data: the handlers never touch the memory behind the handle, nor the fd (the pair records it). */
const rank: ServedRankData = {
  nodeRank: 0,
  nnodes: 1,
  localRank: 0,
  globalRank: 0,
  tpSize: 1,
  backend: 'host',
  device: { backend: 'host', index: 0, uuid: 'in-memory-0', name: 'in-memory', totalBytes: 1 << 20, freeBytes: 0 },
  name: 'tiny',
  model: '/models/tiny',
  architecture: 'LlamaForCausalLM',
  fingerprint: 'fp-tiny',
  fingerprintFields: { content: 'c1', tpRank: 't0' },
  tensors,
  aliases: { tied: 'w' },
  layouts: { checkpoint: { tensors, aliases: { tied: 'w' } } },
  segments: [{ segment: 0, bytes: 256, handle: 'memfd', fd: 1000 }],
  files: [],
};

/** A reply as JSON off the wire: validating it against the schemas is the client's tests' job. */
type Reply = any;

/**
 * A client on one end of a pair whose other end the server accepted as a peer of `pid`. A reply
 * with descriptors comes as its frame on the pair, its fds recorded in `fdsSent`, once `fdGate`
 * (when given) lets the send finish.
 */
function connect(server: OneRankServer, pid = process.pid, fdGate?: Promise<void>) {
  const [client, end] = duplexPair();
  const fdsSent: number[][] = [];
  server.accept(end, pid, async (frame, fds) => {
    await fdGate;
    fdsSent.push(fds);
    end.write(frame);
  });
  const decoder = new FrameDecoder(MAX_RESPONSE_BYTES);
  const waiting: Array<(reply: Reply) => void> = [];
  /** Frames no request asked for (docs/protocol.md, Events). */
  const events: Reply[] = [];
  /** A reply asked for `packed`: the frame after it is its packed manifest (docs/spec/manifest-packed.md). */
  let packedFor: Reply | undefined;
  client.on('data', (chunk: Buffer) => {
    for (const frame of decoder.push(chunk)) {
      if (packedFor) {
        const reply = packedFor;
        packedFor = undefined;
        waiting.shift()!({ ...reply, packed: frame });
        continue;
      }
      const message = JSON.parse(frame.toString('utf8'));
      if (typeof message.packed === 'number') {
        packedFor = message;
        continue;
      }
      if (message.id === null && message.event) events.push(message);
      else waiting.shift()!(message);
    }
  });
  let nextId = 1;
  const serverSideClosed = new Promise<void>((resolve) => end.once('close', resolve));
  return {
    fdsSent,
    events,
    request(message: Record<string, unknown>): Promise<Reply> {
      return new Promise((resolve) => {
        waiting.push(resolve);
        client.write(encodeMessage({ id: nextId++, ...message }));
      });
    },
    /** Hangs up; resolves once the server has seen the connection close. */
    hangUp(): Promise<void> {
      client.destroy();
      return serverSideClosed;
    },
    /** The connection reset under the server (it sees 'close' even while a request holds reading paused). */
    reset(): Promise<void> {
      end.destroy();
      return serverSideClosed;
    },
  };
}

const getState = (mode: 'map' | 'copy', extra: Record<string, unknown> = {}) => ({ cmd: 'get_state', fingerprint: rank.fingerprint, pid: process.pid, mode, ...extra });

/** A server whose freeing of memory waits until the test lets it finish (or fail). */
function serverWithGatedFree() {
  let started!: () => void;
  const freeing = new Promise<void>((resolve) => (started = resolve));
  let finish!: (err?: Error) => void;
  const gate = new Promise<void>((resolve, reject) => (finish = (err) => (err ? reject(err) : resolve())));
  let calls = 0;
  const server = oneRankServer({
    rank,
    log,
    freeMemory: () => {
      calls++;
      started();
      return gate;
    },
  });
  return { server, freeing, finish, calls: () => calls };
}

test('ping: who serves, in which state, with which layouts', async () => {
  const server = oneRankServer({ rank, log, freeMemory: async () => {} });
  try {
    const reply = await connect(server).request({ cmd: 'ping' });
    assert.equal(reply, {
      id: 1,
      ok: true,
      status: 'serving',
      protocolVersion: PROTOCOL_VERSION,
      daemonPid: process.pid,
      model: rank.model,
      name: 'tiny',
      architecture: rank.architecture,
      fingerprint: rank.fingerprint,
      layouts: ['checkpoint'],
      device: { uuid: 'in-memory-0', backend: 'host', index: 0, name: 'in-memory' },
      rank: { globalRank: 0, localRank: 0, nodeRank: 0, nnodes: 1, tpSize: 1 },
      models: [{ name: 'tiny', fingerprint: rank.fingerprint, status: 'serving', globalRank: 0, tpSize: 1, version: 0, current: true }],
    });
  } finally {
    server.close();
  }
});

test('get_state: a lease per request over the manifest; a wrong fingerprint gets the differing fields; an unplanned layout is refused', async () => {
  const server = oneRankServer({ rank, log, freeMemory: async () => {} });
  try {
    const c = connect(server);
    const first = await c.request(getState('map'));
    const second = await c.request(getState('map'));
    assert.is(first.status, 'ok');
    assert.equal(first.tensors, tensors);
    assert.equal(first.aliases, { tied: 'w' });
    assert.equal(first.segments, [{ segment: 0, bytes: 256, handle: 'fd' }], 'a host segment is an fd to ask get_segment_fds for');
    assert.is(first.layout, 'checkpoint');
    assert.is.not(first.leaseId, second.leaseId);
    assert.is(first.columns, undefined, 'objects unless asked for columns');

    // Asked for columns: the same manifest, its tensors as columns (docs/spec/manifest-columns.md).
    const columns = await c.request(getState('map', { columns: true }));
    assert.equal(columns.columns, { name: ['w'], dtypes: ['F32'], dtype: [0], shapes: [[4]], shape: [0], segment: [0], offset: [0], bytes: [16] });
    assert.is(columns.tensors, undefined);
    const { columns: _c, tensors: _t, leaseId: _l, id: _i, ...rest } = columns;
    const { tensors: _t2, leaseId: _l2, id: _i2, ...restFirst } = first;
    assert.equal(rest, restFirst, 'every other field as in the objects reply');

    // Asked for packed (and columns, for a daemon older than packing): the reply says how long
    // the packed manifest is, and the next frame is it (docs/spec/manifest-packed.md).
    const packed = await c.request(getState('map', { packed: true, columns: true }));
    assert.ok(Buffer.isBuffer(packed.packed), 'the frame after the reply is the packed manifest');
    assert.equal(fromPacked(packed.packed), tensors);
    assert.is(packed.columns, undefined);
    const { packed: _p, leaseId: _l3, id: _i3, ...restPacked } = packed;
    assert.equal(restPacked, restFirst, 'every other field as in the objects reply');
    assert.is((await c.request({ cmd: 'ping' })).ok, true, 'the connection reads on after the packed frame');

    const mismatch = await c.request(getState('map', { fingerprint: 'fp-other', fingerprintFields: { content: 'c2', tpRank: 't0' } }));
    assert.equal({ status: mismatch.status, fields: mismatch.fields }, { status: 'mismatch', fields: ['content'] });

    const unplanned = await c.request(getState('map', { layout: 'vllm' }));
    assert.is(unplanned.error.code, 'E_UNKNOWN_LAYOUT');
    assert.equal(unplanned.error.details, { layout: 'vllm', layouts: ['checkpoint'] });
    // A refusal is an answer, not a protocol error: the connection still serves.
    assert.is((await c.request({ cmd: 'stats' })).leases.length, 4);
  } finally {
    server.close();
  }
});

test('a checkpoint file replaced since the version was planned: get_state is E_STALE naming it and how; a lease taken before keeps its descriptors; only watchers that asked hear model_stale', async () => {
  const dir = makeTempDir('handlers-stale');
  const path = join(dir, 'model.safetensors');
  writeFileSync(path, Buffer.alloc(4096, 1));
  const told: string[] = [];
  const server = oneRankServer({ rank, log, freeMemory: async () => {}, onStale: (_, described) => told.push(described) });
  try {
    server.service.watchFiles(new FilesCheck(fileIdentities([path]), 0));
    const asked = connect(server);
    const plain = connect(server);
    await asked.request({ cmd: 'watch', model: 'tiny', stale: true });
    await plain.request({ cmd: 'watch', model: 'tiny' });
    const holder = connect(server);
    const held = await holder.request(getState('map'));
    assert.is(held.status, 'ok', 'unchanged files: served');

    afterCtimeOf(path);
    writeFileSync(join(dir, 'new'), Buffer.alloc(4096, 2));
    renameSync(join(dir, 'new'), path);
    const refused = await connect(server).request(getState('map'));
    assert.is(refused.error.code, 'E_STALE');
    assert.match(refused.error.message, /^model "tiny" version fp-tiny \(rank 0\) is stale: its checkpoint files changed since it was loaded \(model\.safetensors: inode \d+ -> \d+ \(replaced\)\); load the weights from disk/);
    assert.equal(refused.error.details.files.map((f: { path: string; field: string }) => [f.path, f.field]), [[path, 'ino']]);
    assert.equal(told.length, 1);
    assert.match(told[0]!, /^model\.safetensors: inode \d+ -> \d+ \(replaced\)$/);

    // Each connection's reply comes after the events written to it before.
    await asked.request({ cmd: 'stats' });
    await plain.request({ cmd: 'stats' });
    assert.equal(asked.events.map((e) => [e.event, e.model, e.fingerprint, e.files]), [['model_stale', 'tiny', 'fp-tiny', told]]);
    assert.equal(plain.events, [], 'a watcher that did not ask (an older client) hears nothing it does not know');
    assert.equal(await holder.request({ cmd: 'get_segment_fds', leaseId: held.leaseId }), { id: 2, ok: true, segments: [0] }, 'the lease taken before keeps its memory');
  } finally {
    server.close();
    removeDir(dir);
  }
});

test('a get_state whose connection closes while its files are checked grants no lease', async () => {
  const server = oneRankServer({ rank, log, freeMemory: async () => {} });
  try {
    const service = server.all[0]!;
    let checking!: () => void;
    const started = new Promise<void>((resolve) => (checking = resolve));
    let finish!: () => void;
    const gate = new Promise<void>((resolve) => (finish = resolve));
    service.checkFiles = () => (checking(), gate);
    for (const mode of ['map', 'copy'] as const) {
      const c = connect(server);
      void c.request(getState(mode));
      await started;
      await c.reset();
      finish();
      await gate;
      // The handler's continuation runs after the gate's: let it finish before looking.
      await new Promise((resolve) => setImmediate(resolve));
      assert.is(service.leases.size, 0, `${mode}: a lease granted to a closed connection`);
    }
  } finally {
    server.close();
  }
});

test('watch: a name refused over the bound neither hears model_stale nor stays in the table', async () => {
  const server = oneRankServer({ rank, log, freeMemory: async () => {} });
  try {
    const c = connect(server);
    for (let i = 0; i < MAX_WATCHES_PER_CONNECTION; i++) assert.is((await c.request({ cmd: 'watch', model: `m${i}` })).ok, true);
    const refused = await c.request({ cmd: 'watch', model: 'one-too-many', stale: true });
    assert.is(refused.error.code, 'E_TOO_MANY_WATCHES');
    assert.equal(server.watches.watchersOf('one-too-many', 'model_stale'), []);
    assert.equal(server.watches.watchersOf('one-too-many'), []);
  } finally {
    server.close();
  }
});

test('watch: connections that watch have a budget of their own (never idle-closed, they could hold every connection): one over it hears E_TOO_MANY_WATCHERS naming the limit', async () => {
  const server = oneRankServer({ rank, log, freeMemory: async () => {} });
  try {
    const watchers = [];
    for (let i = 0; i < DEFAULT_SERVE_LIMITS.maxWatchers; i++) {
      const w = connect(server);
      assert.is((await w.request({ cmd: 'watch', model: 'tiny' })).ok, true);
      watchers.push(w);
    }
    assert.is((await watchers[0]!.request({ cmd: 'watch', model: 'other' })).ok, true, 'a watcher may watch more names');
    const over = connect(server);
    const refused = await over.request({ cmd: 'watch', model: 'tiny' });
    assert.is(refused.error.code, 'E_TOO_MANY_WATCHERS');
    assert.match(refused.error.message, `${DEFAULT_SERVE_LIMITS.maxWatchers} connections of this socket watch already, the most it keeps (WEIGHTD_SERVE_MAX_WATCHERS=${DEFAULT_SERVE_LIMITS.maxWatchers})`);
    assert.equal(refused.error.details, { limit: DEFAULT_SERVE_LIMITS.maxWatchers });
    assert.is((await over.request({ cmd: 'ping' })).ok, true, 'the refused connection is still served');
    await watchers.pop()!.hangUp();
    assert.is((await over.request({ cmd: 'watch', model: 'tiny' })).ok, true, 'a watcher that closed made room');
  } finally {
    server.close();
  }
});

test('detach ends the named lease; a copy lease ends with its connection, a map lease outlives it', async () => {
  const server = oneRankServer({ rank, log, freeMemory: async () => {} });
  try {
    const watcher = connect(server);
    const c = connect(server);
    const a = await c.request(getState('map'));
    await c.request(getState('map'));
    assert.is((await c.request({ cmd: 'detach', leaseId: a.leaseId })).dropped, 1);
    assert.is((await c.request({ cmd: 'detach', leaseId: a.leaseId })).dropped, 0, 'a lease ends once');

    const copier = connect(server);
    await copier.request(getState('copy'));
    assert.is((await watcher.request({ cmd: 'stats' })).leases.length, 2);
    await copier.hangUp();
    await c.hangUp();
    const after = await watcher.request({ cmd: 'stats' });
    assert.equal(after.leases.map((l: { mode: string }) => l.mode), ['map'], 'the copy lease ended with its connection; the map lease did not');
    assert.is(after.connections, 1);
  } finally {
    server.close();
  }
});

test('release is refused while another process holds a lease; force revokes it and frees once', async () => {
  let frees = 0;
  const server = oneRankServer({ rank, log, freeMemory: async () => void frees++ });
  try {
    // Our parent (the test runner) is alive, so its lease is live and not ours.
    const other = connect(server, process.ppid);
    await other.request({ ...getState('map'), pid: process.ppid });
    const me = connect(server);
    await me.request(getState('map'));

    const refused = await me.request({ cmd: 'release' });
    assert.is(refused.error.code, 'E_LEASE_HELD');
    assert.equal(refused.error.details.leases.map((l: { pid: number }) => l.pid), [process.ppid]);
    assert.is(server.status, 'serving');
    assert.is(frees, 0);

    const forced = await me.request({ cmd: 'release', force: true });
    assert.equal({ alreadyReleased: forced.alreadyReleased, revoked: forced.revoked.map((l: { pid: number }) => l.pid) }, { alreadyReleased: false, revoked: [process.ppid] });
    assert.is(server.status, 'released');
    assert.is((await other.request({ cmd: 'release' })).alreadyReleased, true);
    assert.is(frees, 1);
    const stats = await other.request({ cmd: 'stats' });
    assert.equal({ status: stats.status, leases: stats.leases, deviceBytes: stats.deviceBytes }, { status: 'released', leases: [], deviceBytes: 0 });
  } finally {
    server.close();
  }
});

test('while releasing: get_state is E_RELEASING, a second release waits for the first; then E_RELEASED', async () => {
  const { server, freeing, finish, calls } = serverWithGatedFree();
  try {
    const first = connect(server);
    const second = connect(server);
    const third = connect(server);
    const firstDone = first.request({ cmd: 'release' });
    await freeing;
    assert.is(server.status, 'releasing');
    assert.is((await second.request(getState('map'))).error.code, 'E_RELEASING');
    let secondAnswered = false;
    const secondDone = second.request({ cmd: 'release' }).then((r: Reply) => ((secondAnswered = true), r));
    assert.is((await third.request({ cmd: 'stats' })).status, 'releasing');
    assert.not.ok(secondAnswered, 'no answer before the memory is freed');
    finish();
    assert.is((await firstDone).alreadyReleased, false);
    assert.is((await secondDone).alreadyReleased, true);
    assert.is(calls(), 1, 'the memory is freed once');
    assert.is(server.status, 'released');
    assert.is((await third.request(getState('map'))).error.code, 'E_RELEASED');
  } finally {
    server.close();
  }
});

test('freeing that fails: the releasing client and the one waiting get E_RELEASE_FAILED; nothing is served again', async () => {
  const { server, freeing, finish } = serverWithGatedFree();
  try {
    const first = connect(server);
    const second = connect(server);
    const firstDone = first.request({ cmd: 'release' });
    await freeing;
    const secondDone = second.request({ cmd: 'release' });
    finish(new Error('device lost'));
    for (const reply of [await firstDone, await secondDone]) {
      assert.equal({ code: reply.error.code, message: reply.error.message }, { code: 'E_RELEASE_FAILED', message: 'freeing rank 0 failed: device lost' });
    }
    assert.is(server.status, 'released');
    assert.is((await first.request(getState('map'))).error.code, 'E_RELEASED');
  } finally {
    server.close();
  }
});

test('get_segment_fds: the fds come with the reply, in order, for a live lease of the caller only', async () => {
  const server = oneRankServer({ rank, log, freeMemory: async () => {} });
  try {
    const c = connect(server);
    const { leaseId } = await c.request(getState('map'));
    // Pipelined: the replies keep their order around the one with descriptors.
    const [before, fds, after] = await Promise.all([c.request({ cmd: 'ping' }), c.request({ cmd: 'get_segment_fds', leaseId }), c.request({ cmd: 'ping' })]);
    assert.equal([before.id, fds.id, after.id], [2, 3, 4]);
    assert.equal(fds, { id: 3, ok: true, segments: [0] });
    assert.equal(c.fdsSent, [[1000]]);

    // Another connection of the same process names the lease too (the TypeScript client's way).
    const sameProcess = connect(server);
    assert.equal(await sameProcess.request({ cmd: 'get_segment_fds', leaseId }), { id: 1, ok: true, segments: [0] });

    const other = connect(server, process.ppid);
    const notTheirs = await other.request({ cmd: 'get_segment_fds', leaseId });
    assert.is(notTheirs.error.code, 'E_NO_LEASE');
    assert.match(notTheirs.error.message, /is not a live lease of this client on rank 0; .*ask get_state for a new one/);
    assert.not.ok(notTheirs.error.message.includes(leaseId), 'the refusal does not echo the secret');
    assert.is((await c.request({ cmd: 'get_segment_fds', leaseId: 'f'.repeat(24) })).error.code, 'E_NO_LEASE');
    await c.request({ cmd: 'detach', leaseId });
    assert.is((await c.request({ cmd: 'get_segment_fds', leaseId })).error.code, 'E_NO_LEASE', 'not after detach');
    assert.equal([c.fdsSent, other.fdsSent], [[[1000]], []], 'no refusal sent a descriptor');
  } finally {
    server.close();
  }
});

test('get_segment_fds: a cuda rank (legacy IPC) has none; a released rank gives none', async () => {
  const cudaRank: ServedRankData = { ...rank, backend: 'cuda', segments: [{ segment: 0, bytes: 256, handle: 'AAAA' }] };
  const cuda = oneRankServer({ rank: cudaRank, log, freeMemory: async () => {} });
  try {
    const c = connect(cuda);
    const { leaseId, segments } = await c.request(getState('map'));
    assert.equal(segments, [{ segment: 0, bytes: 256, handle: 'AAAA' }]);
    const refused = await c.request({ cmd: 'get_segment_fds', leaseId });
    assert.equal(refused.error, { code: 'E_NO_FDS', message: "rank 0's segments are CUDA IPC handles; use get_state's handles" });
  } finally {
    cuda.close();
  }
  const host = oneRankServer({ rank, log, freeMemory: async () => {} });
  try {
    const c = connect(host);
    const { leaseId } = await c.request(getState('map'));
    await c.request({ cmd: 'release' });
    assert.is((await c.request({ cmd: 'get_segment_fds', leaseId })).error.code, 'E_RELEASED');
  } finally {
    host.close();
  }
});

test('a release waits for descriptors still being sent before it frees (and so closes) them', async () => {
  let frees = 0;
  const server = oneRankServer({ rank, log, freeMemory: async () => void frees++ });
  try {
    let letSend!: () => void;
    const sender = connect(server, process.pid, new Promise<void>((resolve) => (letSend = resolve)));
    const { leaseId } = await sender.request(getState('map'));
    const fdsReply = sender.request({ cmd: 'get_segment_fds', leaseId });
    const releaser = connect(server);
    await releaser.request({ cmd: 'ping' }); // the get_segment_fds above was handled before this
    const released = releaser.request({ cmd: 'release', force: true });
    await new Promise(setImmediate);
    assert.is(server.status, 'releasing');
    assert.is(frees, 0, 'not freed while the send is under way');
    letSend();
    assert.equal(await fdsReply, { id: 2, ok: true, segments: [0] });
    assert.is((await released).alreadyReleased, false);
    assert.is(frees, 1);
  } finally {
    server.close();
  }
});

test('a request counts, a protocol error counts and ends only its own connection', async () => {
  const server = oneRankServer({ rank, log, freeMemory: async () => {} });
  try {
    const [bad, end] = duplexPair();
    server.accept(end, process.pid);
    const closed = new Promise<void>((resolve) => end.once('close', resolve));
    bad.resume();
    bad.write(Buffer.from('GET / HTTP/1.1\r\n\r\n'));
    await closed;
    const good = connect(server);
    await good.request({ cmd: 'ping' });
    const stats = await good.request({ cmd: 'stats' });
    assert.equal({ requests: stats.requests, protocolErrors: stats.protocolErrors, connections: stats.connections }, { requests: 2, protocolErrors: 1, connections: 1 });
  } finally {
    server.close();
  }
});

test.run();
