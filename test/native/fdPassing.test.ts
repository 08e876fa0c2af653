// Descriptor passing (native/unix_fds.h) over a real Unix socket: a net.Server's accepted
// connection sends a frame and hundreds of fds with sendFds (src/wire/socketFdWriter.ts); unixRequest receives them in
// order, each still naming its own file. Every failure of unixRequest closes every fd it had
// received: the test counts this process's open descriptors before and after.
import { spawn } from 'node:child_process';
import { chownSync, closeSync, mkdtempSync, openSync, readdirSync, readlinkSync, readSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { pbkdf2 } from 'node:crypto';
import { promisify } from 'node:util';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DeviceError, type WeightdError } from '../../src/errors.js';
import { addon } from '../../src/native/addon.js';
import { sendFds } from '../../src/wire/socketFdWriter.js';

const HEADER_BYTES = 10;

function frameOf(payload: Buffer, declaredLength = payload.length): Buffer {
  const header = Buffer.alloc(HEADER_BYTES);
  header.write('TEST', 0, 'latin1');
  header.writeUInt16BE(1, 4);
  header.writeUInt32BE(declaredLength, 6);
  return Buffer.concat([header, payload]);
}

const pbkdf2Async = promisify(pbkdf2);

/** Resolves once `done` holds, looking every 10 ms; fails the test if it never does (10 s). */
async function until(done: () => boolean, what: string): Promise<void> {
  for (const end = Date.now() + 10_000; !done(); await new Promise((r) => setTimeout(r, 10))) {
    if (Date.now() > end) assert.unreachable(`never: ${what}`);
  }
}

function openFdCount(): number {
  return readdirSync('/proc/self/fd').length;
}

function fdOf(socket: Socket): number {
  return (socket as unknown as { _handle: { fd: number } })._handle.fd;
}

interface TestServer {
  path: string;
  /** Called with each connection the server accepts, before its data. */
  onAccept?: (socket: Socket) => void;
  /** Resolves once every connection the server accepted has closed, so counts are exact. */
  connectionsClosed(): Promise<void>;
  close(): Promise<void>;
}

/** A server on a fresh socket; `onRequest` runs on each connection once a whole request frame has arrived. */
async function serve(onRequest: (socket: Socket, request: Buffer) => void | Promise<void>): Promise<TestServer> {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-fds-'));
  const path = join(dir, 's.sock');
  const closed: Promise<void>[] = [];
  const handle: TestServer = { path, connectionsClosed: async () => {}, close: async () => {} };
  const server: Server = createServer((socket) => {
    handle.onAccept?.(socket);
    closed.push(new Promise((resolve) => socket.on('close', () => resolve())));
    socket.on('error', () => {});
    let got = Buffer.alloc(0);
    socket.on('data', (chunk) => {
      got = Buffer.concat([got, chunk]);
      if (got.length >= HEADER_BYTES && got.length === HEADER_BYTES + got.readUInt32BE(6)) void onRequest(socket, got);
    });
  });
  await new Promise<void>((resolve) => server.listen(path, resolve));
  handle.connectionsClosed = async () => {
    await Promise.all(closed);
  };
  handle.close = async () => {
    await new Promise((resolve) => server.close(resolve));
    rmSync(dir, { recursive: true, force: true });
  };
  return handle;
}

/** `count` files, file i holding "file <i>", opened read-only; and a cleanup. */
function makeFiles(count: number): { fds: number[]; paths: string[]; remove: () => void } {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-fds-files-'));
  const paths: string[] = [];
  const fds: number[] = [];
  for (let i = 0; i < count; i++) {
    const p = join(dir, `f${i}`);
    writeFileSync(p, `file ${i}`);
    paths.push(p);
    fds.push(openSync(p, 'r'));
  }
  return { fds, paths, remove: () => { for (const fd of fds) closeSync(fd); rmSync(dir, { recursive: true, force: true }); } };
}

function contentOf(fd: number): string {
  const buf = Buffer.alloc(64);
  return buf.subarray(0, readSync(fd, buf, 0, buf.length, 0)).toString();
}

async function rejection(p: Promise<unknown>): Promise<DeviceError> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  assert.instance(err, DeviceError, `expected a DeviceError, got ${String(err)}`);
  return err as DeviceError;
}

test('a frame and 300 fds (two batches) sent by sendFds arrive in order, each naming its own file', async () => {
  const files = makeFiles(300);
  const payload = Buffer.from('x'.repeat(5000));
  const server = await serve(async (socket, request) => {
    assert.is(request.subarray(HEADER_BYTES).toString(), 'hello');
    await sendFds(fdOf(socket), frameOf(payload), files.fds, 5000);
  });
  try {
    const before = openFdCount();
    const reply = await addon().unixRequest(server.path, frameOf(Buffer.from('hello')), [], 5000, 1 << 20);
    assert.equal(reply.frame, frameOf(payload));
    assert.is(reply.fds.length, 300);
    reply.fds.forEach((fd, i) => {
      assert.is(readlinkSync(`/proc/self/fd/${fd}`), files.paths[i], `fd ${i} names its file`);
      assert.is(contentOf(fd), `file ${i}`);
    });
    for (const fd of reply.fds) addon().closeFd(fd);
    await server.connectionsClosed();
    assert.is(openFdCount(), before, 'the request left no descriptor open');
  } finally {
    await server.close();
    files.remove();
  }
});

test('a reply without fds and a frame of exactly maxReplyBytes are accepted', async () => {
  const server = await serve((socket) => sendFds(fdOf(socket), frameOf(Buffer.from('ok')), [], 5000));
  try {
    const reply = await addon().unixRequest(server.path, frameOf(Buffer.alloc(0)), [], 5000, HEADER_BYTES + 2);
    assert.equal(reply, { frame: frameOf(Buffer.from('ok')), fds: [] });
  } finally {
    await server.close();
  }
});

/** Runs a request that must fail with `code`, and checks it left this process's descriptor count as it was. */
async function failsClosingEverything(server: TestServer | undefined, request: () => Promise<unknown>, code: string): Promise<DeviceError> {
  const before = openFdCount();
  const err = await rejection(request());
  assert.is(err.code, code, err.message);
  await server?.connectionsClosed();
  assert.is(openFdCount(), before, `${code}: every received fd and the socket were closed`);
  return err;
}

test('no socket at the path: E_CONNECT naming ENOENT', async () => {
  const err = await failsClosingEverything(undefined, () => addon().unixRequest('/nonexistent-weightd-dir/s.sock', frameOf(Buffer.alloc(0)), [], 1000, 1024), 'E_CONNECT');
  assert.match(err.message, /\/nonexistent-weightd-dir\/s\.sock.*ENOENT/);
});

test('a server that closes mid-frame: E_PEER_CLOSED, and the fds it had sent are closed', async () => {
  const files = makeFiles(7);
  const server = await serve(async (socket) => {
    await sendFds(fdOf(socket), frameOf(Buffer.alloc(20), 100), files.fds, 5000);
    socket.destroy();
  });
  try {
    const err = await failsClosingEverything(server, () => addon().unixRequest(server.path, frameOf(Buffer.alloc(0)), [], 5000, 1024), 'E_PEER_CLOSED');
    assert.match(err.message, /closed the connection after 30 of 110 reply bytes/);
  } finally {
    await server.close();
    files.remove();
  }
});

test('a reply larger than maxReplyBytes: E_FRAME_TOO_LARGE, and the fds on its header are closed', async () => {
  const files = makeFiles(3);
  const server = await serve((socket) => sendFds(fdOf(socket), frameOf(Buffer.alloc(1000)), files.fds, 5000));
  try {
    const err = await failsClosingEverything(server, () => addon().unixRequest(server.path, frameOf(Buffer.alloc(0)), [], 5000, 1009), 'E_FRAME_TOO_LARGE');
    assert.match(err.message, /declares 1010 bytes, more than the 1009/);
  } finally {
    await server.close();
    files.remove();
  }
});

test('a server that never finishes its reply: E_FD_TIMEOUT, and the fds it had sent are closed', async () => {
  const files = makeFiles(4);
  // Half a header with fds on it, then nothing: the request can end only by its timeout.
  const server = await serve((socket) => sendFds(fdOf(socket), frameOf(Buffer.alloc(0)).subarray(0, 5), files.fds, 5000));
  try {
    const err = await failsClosingEverything(server, () => addon().unixRequest(server.path, frameOf(Buffer.alloc(0)), [], 300, 1024), 'E_FD_TIMEOUT');
    assert.match(err.message, /within 300 ms/);
  } finally {
    await server.close();
    files.remove();
  }
});

test('a server of another uid is refused with E_PEER_UID naming both uids', async () => {
  if (process.getuid?.() !== 0) {
    console.log('  (skipped: needs root to run the server as a throwaway uid)');
    return;
  }
  const uid = 48611; // no account uses it (test/native/resourceLimits.test.ts)
  const dir = mkdtempSync(join(tmpdir(), 'weightd-fds-uid-'));
  chownSync(dir, uid, uid);
  const path = join(dir, 's.sock');
  const script = `const s = require('node:net').createServer(() => {}); s.listen(${JSON.stringify(path)}, () => console.log('listening'));`;
  const child = spawn('setpriv', [`--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', () => resolve());
      child.on('exit', (code) => reject(new Error(`the server as uid ${uid} exited ${code} before listening`)));
    });
    const err = await failsClosingEverything(undefined, () => addon().unixRequest(path, frameOf(Buffer.alloc(0)), [], 5000, 1024), 'E_PEER_UID');
    assert.match(err.message, new RegExp(`runs as uid ${uid}, not this process's uid 0`));
  } finally {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

test('sendFds on a descriptor that is not a socket, or with more batches than bytes: E_FD_SEND', async () => {
  const files = makeFiles(251);
  try {
    const notSocket = await rejection(sendFds(files.fds[0]!, frameOf(Buffer.alloc(0)), [], 1000));
    assert.is(notSocket.code, 'E_FD_SEND');
    assert.match(notSocket.message, /socket fd \d+ failed after 0 of 10 bytes/);
    const tooShort = await rejection(sendFds(files.fds[0]!, Buffer.alloc(1), files.fds, 1000));
    assert.is(tooShort.code, 'E_FD_SEND');
    assert.match(tooShort.message, /a frame of 1 bytes cannot carry 251 fds/);
  } finally {
    files.remove();
  }
});

test('replies to peers that stop reading wait on the event loop, not on libuv threads: with 8 pending, a threadpool job still runs; each goes once its peer reads, fails when it leaves, or at its deadline', async () => {
  const files = makeFiles(1);
  const sockets: Socket[] = [];
  const server = await serve(() => {});
  const accepted: Socket[] = [];
  const acceptedAll = new Promise<void>((resolve) => {
    server.onAccept = (s) => {
      accepted.push(s);
      if (accepted.length === 9) resolve();
    };
  });
  try {
    const before = openFdCount();
    // Peers that connect and do not read: a 4 MiB reply fills their socket and waits.
    for (let i = 0; i < 9; i++) {
      const peer = connect(server.path);
      peer.pause();
      peer.on('error', () => {});
      sockets.push(peer);
    }
    await acceptedAll;
    const big = frameOf(Buffer.alloc(4 << 20, 7));
    const settled: string[] = [];
    const sends = accepted.slice(0, 8).map((s, i) =>
      sendFds(fdOf(s), big, files.fds, 60_000).then(
        () => void settled.push(`${i} sent`),
        (e: DeviceError) => void settled.push(`${i} ${e.code}`),
      ),
    );
    // The pool has 4 threads (UV_THREADPOOL_SIZE unset): a send waiting on one would starve this.
    await pbkdf2Async('weightd', 'salt', 1, 32, 'sha256');
    assert.equal(settled, [], 'every send still waits for its peer, and none held a thread');
    // Peer 0 reads everything: its reply arrives whole, with the fd.
    let got = 0;
    sockets[0]!.on('data', (chunk: Buffer) => (got += chunk.length));
    sockets[0]!.resume();
    await sends[0];
    assert.equal(settled, ['0 sent']);
    await until(() => got === big.length, `peer 0 read the ${big.length} bytes of its reply`);
    // Peer 1 leaves: its send fails at once, by name.
    sockets[1]!.destroy();
    await sends[1];
    assert.match(settled[1]!, /^1 E_FD_SEND$/);
    // A short deadline on the ninth: E_FD_TIMEOUT, naming what it was sending.
    const late = await rejection(sendFds(fdOf(accepted[8]!), big, files.fds, 200));
    assert.is(late.code, 'E_FD_TIMEOUT');
    assert.match(late.message, /^sending 4194314 bytes and 1 fds on socket fd \d+ did not finish within 200 ms; the peer is stuck/);
    for (const peer of sockets) peer.destroy();
    await Promise.all(sends);
    assert.equal(settled.slice(2).sort(), ['2', '3', '4', '5', '6', '7'].map((i) => `${i} E_FD_SEND`));
    for (const s of accepted) s.destroy();
    await server.connectionsClosed();
    // At most: an earlier test's descriptors may still have been closing when `before` was taken.
    await until(() => openFdCount() <= before, `the descriptors opened are closed again (${before} before)`);
  } finally {
    for (const peer of sockets) peer.destroy();
    await server.close();
    files.remove();
  }
});

test('replies to a peer that reads on another core as they are sent all arrive whole: a try that finds the socket emptied meanwhile ends the send', async () => {
  const files = makeFiles(1);
  let accepted!: Socket;
  const server = await serve(() => {});
  const gotOne = new Promise<void>((resolve) => (server.onAccept = (s) => ((accepted = s), resolve())));
  // The reader is another process, so it drains the socket while this one is inside sendFds.
  const reader = spawn(process.execPath, ['-e', `let n = 0; const s = require('node:net').connect(${JSON.stringify(server.path)}); s.on('data', (c) => (n += c.length)); s.on('end', () => process.stdout.write(String(n)));`]);
  let out = '';
  reader.stdout.on('data', (c: Buffer) => (out += c.toString()));
  const exited = new Promise<void>((resolve) => reader.on('exit', () => resolve()));
  try {
    await gotOne;
    // Replies a little larger than the socket's buffer (about 208 KiB) leave little for the tries
    // after the first, which the reader may already have made room for. A build that tried again
    // at once, only to learn what was left, once sent everything there and then failed its next
    // try ("this send has ended already"), blaming a peer that read it all.
    let sent = 0;
    for (let i = 0; i < 256; i++) {
      const frame = frameOf(Buffer.alloc((200 << 10) + (i % 64) * 1024, 5));
      await sendFds(fdOf(accepted), frame, files.fds, 10_000);
      sent += frame.length;
    }
    accepted.end();
    await exited;
    assert.is(Number(out), sent, 'every byte of every reply arrived');
  } finally {
    reader.kill();
    accepted?.destroy();
    await server.close();
    files.remove();
  }
});

test('a send whose signal aborts gives up at once: E_FD_SEND naming the bytes left, and its duplicate of the socket is closed', async () => {
  const files = makeFiles(1);
  let accepted!: Socket;
  const server = await serve(() => {});
  const gotOne = new Promise<void>((resolve) => (server.onAccept = (s) => ((accepted = s), resolve())));
  const peer = connect(server.path);
  peer.pause();
  peer.on('error', () => {});
  try {
    await gotOne;
    const big = frameOf(Buffer.alloc(4 << 20, 7));
    const before = openFdCount();
    const abort = new AbortController();
    const sending = sendFds(fdOf(accepted), big, files.fds, 60_000, abort.signal);
    assert.is(openFdCount(), before + 1, 'the pending rest holds a duplicate of the socket');
    abort.abort();
    const err = await sending.then(
      (): WeightdError => assert.unreachable('an aborted send resolved') as never,
      (e: WeightdError) => e,
    );
    assert.is(err.code, 'E_FD_SEND');
    const left = /with (\d+) of/.exec(err.message)?.[1];
    assert.ok(Number(left) > 0 && Number(left) < big.length, `the bytes left, not the whole frame (${left})`);
    assert.match(err.message, /^the connection closed with \d+ of the 4194314 bytes of its reply \(and its 1 fds\) unsent$/);
    assert.is(openFdCount(), before, 'the duplicate is closed with the send, not by the garbage collector');
  } finally {
    peer.destroy();
    accepted?.destroy();
    await server.close();
    files.remove();
  }
});

test('closeFd of a descriptor that is not open: E_FD_CLOSE', () => {
  const fd = openSync('/dev/null', 'r');
  addon().closeFd(fd);
  try {
    addon().closeFd(fd);
    assert.unreachable('a closed fd was closed again');
  } catch (err) {
    assert.is((err as DeviceError).code, 'E_FD_CLOSE');
  }
});

test('bad arguments are TypeErrors, checked before any work', () => {
  assert.throws(() => addon().fdSendStart(-1, Buffer.alloc(1), []), /socketFd must be a non-negative/);
  assert.throws(() => addon().unixRequest('/x', 'frame' as unknown as Buffer, [], 1, 1), /frame must be a Buffer/);
  assert.throws(() => addon().unixRequest('/x', Buffer.alloc(1), [1.5], 1, 1), /fd must be a non-negative safe integer/);
});

test.run();
