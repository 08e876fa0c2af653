// Malformed requests: each gets an error reply with its code, its connection is closed, any fds
// it brought are closed, and the keeper serves on with no fd left behind (its /proc fds are
// counted before and after). A client killed mid-send costs nothing either.
import { closeSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { errorCode, KeeperError } from '../../src/errors.js';
import { encodeKeep, encodePing } from '../../src/keeper/keeperProtocol.js';
import { addon } from '../../src/native/addon.js';
import { fdKinds, memfdWith, startTestKeeper, waitUntil, type TestKeeper } from '../helpers/keeper.js';
import { fromHex, keeperWire } from '../helpers/keeperWireVectors.js';
import { runFixture } from '../helpers/runFixture.js';

const sendHalfAndDie = fileURLToPath(new URL('./fixtures/sendHalfAndDie.js', import.meta.url));

let keeper: TestKeeper;
let idle: ReturnType<typeof fdKinds>;
let memfd: number;

test.before(async () => {
  keeper = await startTestKeeper();
  idle = fdKinds(keeper.pid);
  memfd = await memfdWith(Buffer.from('x'));
});

test.after(async () => {
  closeSync(memfd);
  await keeper.kill();
});

/** After each case: the keeper answers PING and holds exactly the fds it held idle. */
async function servesOnWithNoLeak(): Promise<void> {
  assert.is((await keeper.client.ping()).records, 0);
  let have = {};
  await waitUntil(() => `the keeper's fds are back to ${JSON.stringify(idle)} (last seen: ${JSON.stringify(have)})`, () => JSON.stringify((have = fdKinds(keeper.pid))) === JSON.stringify(idle));
}

/** Sends raw bytes; resolves with the error reply's code and message once the keeper has closed the connection. */
function rawRequest(bytes: Buffer): Promise<{ code: string; message: string }> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const s = connect(keeper.socket, () => s.write(bytes));
    s.on('data', (d) => chunks.push(d));
    // The keeper may close with bytes of ours still unread (a reset) or before we wrote them all (EPIPE).
    s.on('error', (err) => (errorCode(err) === 'ECONNRESET' || errorCode(err) === 'EPIPE' ? undefined : reject(err)));
    s.on('close', () => {
      const reply = Buffer.concat(chunks);
      if (reply.length < 15 || reply.toString('latin1', 0, 4) !== 'WGTK' || reply[10] !== 1) {
        reject(new Error(`expected an error reply, got ${reply.toString('hex')}`));
        return;
      }
      const codeLength = reply.readUInt16BE(11);
      const code = reply.toString('utf8', 13, 13 + codeLength);
      resolve({ code, message: reply.toString('utf8', 15 + codeLength, 15 + codeLength + reply.readUInt16BE(13 + codeLength)) });
    });
  });
}

// The frames the wire spec says the keeper refuses (docs/spec/keeper-wire.md, test/vectors/keeper-wire.json).
for (const { why, frame, code, says } of keeperWire.refused) {
  test(`${why}: ${code}, the connection closed, the keeper serves on`, async () => {
    const reply = await rawRequest(fromHex(frame));
    assert.is(reply.code, code);
    assert.ok(reply.message.includes(says), `"${reply.message}" says "${says}"`);
    await servesOnWithNoLeak();
  });
}

async function keeperError(request: Promise<unknown>): Promise<KeeperError> {
  const err = await request.then(() => undefined, (e: unknown) => e);
  assert.instance(err, KeeperError, String(err));
  return err as KeeperError;
}

test('KEEP with no fds: E_NO_FDS', async () => {
  const err = await keeperError(keeper.client.keep('host-0', 'fp', Buffer.from('{}'), []));
  assert.is(err.code, 'E_NO_FDS');
  assert.match(err.message, /KEEP of host-0 fp came with no fds/);
  await servesOnWithNoLeak();
});

test('a request other than KEEP carrying fds: E_UNEXPECTED_FDS, and the keeper closes them', async () => {
  const reply = await addon().unixRequest(keeper.socket, encodePing(), [memfd, memfd, memfd], 5000, 1 << 20);
  assert.is(reply.frame[10], 1);
  assert.match(reply.frame.toString('utf8'), /E_UNEXPECTED_FDS.*op 5 came with 3 fds/);
  await servesOnWithNoLeak();
});

test('a truncated KEEP with fds: E_BAD_REQUEST, and the keeper closes them', async () => {
  const whole = encodeKeep('host-0', 'fp', Buffer.from('{}'));
  const cut = Buffer.concat([whole.subarray(0, 6), Buffer.from([0, 0, 0, 4]), whole.subarray(10, 14)]);
  const reply = await addon().unixRequest(keeper.socket, cut, [memfd, memfd], 5000, 1 << 20);
  assert.match(reply.frame.toString('utf8'), /E_BAD_REQUEST.*request truncated: device needs 6 bytes at offset 3 of a 4-byte payload/);
  await servesOnWithNoLeak();
});

test('a KEEP of more than 4096 fds: E_TOO_MANY_FDS, and the keeper closes every one it received', async () => {
  const reply = await addon().unixRequest(keeper.socket, encodeKeep('host-0', 'fp', Buffer.alloc(5000)), Array(4097).fill(memfd), 20_000, 1 << 20).then(
    (r) => r.frame.toString('utf8'),
    // The keeper may close before it has read all of them: the sender then sees a reset.
    (err: unknown) => String((err as Error).message),
  );
  assert.match(reply, /E_TOO_MANY_FDS|ECONNRESET|EPIPE|Connection reset|Broken pipe/);
  await servesOnWithNoLeak();
});

test("a KEEP whose fds the keeper's open-file limit cuts short: E_TOO_MANY_FDS naming the limit, not the sender's batch", async () => {
  // Its own keeper, limited to 16 open files: the 40 fds of one piece cannot all be installed.
  const limited = await startTestKeeper([], { prefix: ['prlimit', '--nofile=16', '--'] });
  try {
    const reply = await addon().unixRequest(limited.socket, encodeKeep('host-0', 'fp', Buffer.alloc(8)), Array(40).fill(memfd), 20_000, 1 << 20);
    const text = reply.frame.toString('utf8');
    assert.match(text, /E_TOO_MANY_FDS/);
    assert.match(text, /the keeper could take only \d+ of the fds sent on one piece of a request: its open-file limit \(RLIMIT_NOFILE\) is reached/);
    assert.is((await limited.client.ping()).records, 0, 'nothing kept, and it serves on');
  } finally {
    await limited.kill();
  }
});

test("clients past the keeper's open-file limit are closed, said in its log, and it serves on once they go", async () => {
  const limited = await startTestKeeper([], { prefix: ['prlimit', '--nofile=16', '--'] });
  const clients: Socket[] = [];
  let closedByKeeper = 0;
  try {
    // More connections than it has descriptors for: before, those were left in the backlog, the
    // listener stayed readable and the keeper's loop spun on it.
    for (let i = 0; i < 24; i++) {
      const c = connect(limited.socket);
      c.on('error', () => {});
      c.on('close', () => closedByKeeper++);
      clients.push(c);
    }
    await waitUntil(() => `the keeper refuses what it cannot hold (${closedByKeeper} closed so far)`, () => closedByKeeper > 0 && limited.stderr().includes("refused a client: the keeper's open-file limit is reached"));
    for (const c of clients) c.destroy();
    await waitUntil('the keeper answers again', async () => (await limited.client.ping().then((p) => p.records === 0, () => false)));
  } finally {
    for (const c of clients) c.destroy();
    await limited.kill();
  }
});

test('a client killed mid-send: the keeper drops its half request, closes its fds and serves on', async () => {
  const end = await runFixture(sendHalfAndDie, [keeper.socket, `/proc/${process.pid}/fd/${memfd}`]);
  assert.is(end.signal, 'SIGKILL');
  await servesOnWithNoLeak();
  await waitUntil('the keeper logs the cut-off request', () => keeper.stderr().includes('client went away mid-request'));
});

test.run();
