// The control socket (docs/operations.md, Control socket): weightd ctl loads, lists and unloads
// models of a running daemon; the socket is 0600, refuses another uid, bounds each request's
// size and the rate of requests, and refuses what does not match its schema.
import { spawn } from 'node:child_process';
import { chownSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { controlRequest } from '../../src/cli/runCtl.js';
import { ControlServer } from '../../src/control/controlServer.js';
import type { ControlTarget } from '../../src/control/controlTarget.js';
import { DEFAULT_CONTROL_LIMITS, type ControlLimits } from '../../src/control/controlProtocol.js';
import { MAX_CONTROL_REQUEST_BYTES } from '../../src/control/controlSocket.js';
import { encodeFrame, FrameDecoder, parsePayload } from '../../src/wire/frameCodec.js';
import { crossReadDeadline } from '../helpers/crossingPeer.js';
import { startDaemon } from '../helpers/daemon.js';
import { waitUntil } from '../helpers/keeper.js';
import { exampleModel, freshSocketDir, freshTempDir, mainJs } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';

const THROWAWAY_UID = 48611; // no account uses it (test/native/resourceLimits.test.ts)
const log = pino({ level: 'silent' });

test('weightd ctl lists, loads a new version beside the old, says a loaded model is loaded, and unloads; bad targets name what is loaded', async () => {
  const dir = freshTempDir();
  const v2 = writeVariant(exampleModel, `${dir}/v2`);
  const socketDir = freshSocketDir();
  const daemon = await startDaemon({ model: exampleModel, tp: 1, socketDir });
  const ctl = (...args: string[]) => runCli(['ctl', '--weight-cache-socket-dir', socketDir, ...args], { timeoutMs: 60_000 });
  try {
    const control = join(socketDir, `control-${daemon.pid}.sock`);
    assert.is(statSync(control).mode & 0o777, 0o600, 'the control socket is 0600');
    const list = await ctl('list');
    assert.is(list.code, 0, list.stderr);
    assert.match(list.stdout, /^tiny-llama \(own\) {2}v0 {2}serving {2}tp=1 {2}\d+\.\d MiB {2}leases=0 /m);

    const load = await ctl('load', '--model', v2, '--name', 'tiny-llama');
    assert.is(load.code, 0, load.stderr);
    assert.match(load.stdout, /^tiny-llama loaded and serving \(fingerprint [0-9a-f]{64}\)$/m);
    const again = await ctl('load', '--model', v2, '--name', 'tiny-llama');
    assert.is(again.code, 0, again.stderr);
    assert.match(again.stdout, /tiny-llama is already loaded \(fingerprint [0-9a-f]{64}\): nothing to do/);
    // --json: the daemon's reply, for scripts, on every subcommand.
    const againJson = JSON.parse((await ctl('load', '--model', v2, '--name', 'tiny-llama', '--json')).stdout) as { ok: boolean; alreadyLoaded: boolean };
    assert.equal([againJson.ok, againJson.alreadyLoaded], [true, true]);

    const json = JSON.parse((await ctl('list', '--json')).stdout) as { models: Array<{ name: string; state: string; own: boolean }> };
    assert.equal(json.models.map((m) => [m.name, m.own, m.state]), [['tiny-llama', true, 'released'], ['tiny-llama', false, 'serving']], 'no lease held the old version: it was freed at once');

    const unknownJson = await ctl('unload', 'nope', '--json');
    assert.is(unknownJson.code, 1);
    assert.is((JSON.parse(unknownJson.stdout) as { error: { code: string } }).error.code, 'E_UNKNOWN_MODEL');
    const unknown = await ctl('unload', 'nope');
    assert.is(unknown.code, 1);
    assert.match(unknown.stderr, /weightd ctl unload: E_UNKNOWN_MODEL: no loaded model is named or fingerprinted "nope"; loaded: tiny-llama \(/);
    const unload = await ctl('unload', 'tiny-llama', '--force');
    assert.is(unload.code, 0, unload.stderr);
    assert.match(unload.stdout, /^tiny-llama \(fingerprint [0-9a-f]{16}\) unloaded: freed now\n$/);
    await waitUntil('the model is gone', async () => (JSON.parse((await ctl('list', '--json')).stdout) as { models: unknown[] }).models.length === 1);
  } finally {
    await daemon.stop();
  }
  const none = await ctl('list');
  assert.is(none.code, 2, 'no daemon to ask is a usage error');
  assert.match(none.messages, /no running weightd has a control socket in .*; start one, or pass --weight-cache-socket-dir or --control/);
});

/** A control server over a fake node, for the bounds. */
async function fakeControl(limits: Partial<ControlLimits>) {
  const calls: string[] = [];
  const target: ControlTarget = {
    load: async (r) => (calls.push(`load ${r.model}`), { name: 'x', fingerprint: 'f', alreadyLoaded: false, model: {} as never, evicted: [] }),
    unload: (t) => (calls.push(`unload ${t}`), { unloaded: [], force: false }),
    models: () => (calls.push('list'), []),
    rollback: (n, v) => (calls.push(`rollback ${n} ${v}`), { name: n, version: v, fingerprint: 'f', alreadyCurrent: false }),
  };
  const server = new ControlServer({ socketDir: freshSocketDir(), log, target, limits });
  const path = await server.listen();
  return { server, path, calls };
}

test('control requests are rate limited, bounded in size and checked against the schema', async () => {
  const { server, path, calls } = await fakeControl({ burst: 3, perSecond: 0 });
  try {
    const replies = [];
    for (let i = 0; i < 5; i++) replies.push(await controlRequest(path, { cmd: 'list' }));
    assert.equal(replies.map((r) => (r.ok ? 'ok' : r.error.code)), ['ok', 'ok', 'ok', 'E_RATE_LIMITED', 'E_RATE_LIMITED']);
    assert.match((replies[3] as { error: { message: string } }).error.message, /more than 3 control requests at once \(then 0 a second\): this one was refused; wait a moment and send it again/);
    assert.is(calls.length, 3, 'a refused request never reached the node');
  } finally {
    server.close();
  }
  const fresh = await fakeControl({ burst: 10, perSecond: 0 });
  try {
    const bad = await controlRequest(fresh.path, { cmd: 'unload', target: 'x', extra: 1 } as never);
    assert.ok(!bad.ok && bad.error.code === 'E_BAD_REQUEST' && /control request does not match the schema: \(root\): Unrecognized key/.test(bad.error.message), JSON.stringify(bad));
    const big = await new Promise<string>((resolve, reject) => {
      const s = connect(fresh.path);
      let got = '';
      s.on('connect', () => s.write(encodeFrame(JSON.stringify({ cmd: 'load', model: 'x'.repeat(MAX_CONTROL_REQUEST_BYTES) }))));
      s.on('data', (d) => (got += d.subarray(10).toString()));
      s.on('error', (e: NodeJS.ErrnoException) => (e.code === 'EPIPE' || e.code === 'ECONNRESET' ? undefined : reject(e)));
      s.on('close', () => resolve(got));
    });
    assert.match(big, /"code":"E_FRAME_TOO_LARGE"/, 'a request over the bound is refused before it is read whole');
    assert.equal(fresh.calls, []);
  } finally {
    fresh.server.close();
  }
});

/**
 * A peer that connects and sends nothing, and never closes its side even when the daemon closes
 * its own (as `nc` or a stuck script would): resolves with what it was sent once the daemon is done with it.
 */
function idlePeer(path: string): { connected: Promise<void>; answered: Promise<string>; close(): void } {
  const s = connect({ path, allowHalfOpen: true });
  const decoder = new FrameDecoder(1 << 20);
  let got = 'nothing';
  s.on('data', (d) => {
    const [frame] = decoder.push(d);
    if (frame) got = (parsePayload(frame) as { error: { code: string } }).error.code;
  });
  s.on('error', () => {});
  const connected = new Promise<void>((resolve) => s.once('connect', resolve));
  const answered = new Promise<string>((resolve) => s.once('end', () => resolve(got)).once('close', () => resolve(got)));
  return { connected, answered, close: () => s.destroy() };
}

test('a control request that crosses the read deadline can still be sent, and its peer reads E_READ_TIMEOUT', async () => {
  const { server, path, calls } = await fakeControl({ readTimeoutMs: 50 });
  try {
    assert.is(await crossReadDeadline(path, encodeFrame(JSON.stringify({ cmd: 'list' }))), 'sent\nE_READ_TIMEOUT\n');
    assert.equal(calls, [], 'a request completed after its deadline is not served');
  } finally {
    server.close();
  }
});

test('idle control connections are closed at the read deadline, so a ctl command gets in after them', async () => {
  const { server, path, calls } = await fakeControl({ readTimeoutMs: 50 });
  const idle = Array.from({ length: DEFAULT_CONTROL_LIMITS.maxConnections }, () => idlePeer(path));
  try {
    assert.equal(await Promise.all(idle.map((p) => p.answered)), idle.map(() => 'E_READ_TIMEOUT'));
    // Each is closed on the daemon's side a grace after it was told (so that a peer whose request
    // crossed the refusal reads it), not left half-open until the peer closes, which these never
    // do: otherwise the cap counts all 16 for good and this command is shut out.
    await waitUntil('a ctl command gets in after the idle connections', async () => (await controlRequest(path, { cmd: 'list' })).ok);
    assert.equal(calls, ['list'], 'only the command that got in reached the node');
  } finally {
    for (const p of idle) p.close();
    server.close();
  }
});

test('a control connection over the cap is refused with a frame naming the cap, not closed in silence', async () => {
  const { server, path, calls } = await fakeControl({ readTimeoutMs: 60_000 });
  const cap = DEFAULT_CONTROL_LIMITS.maxConnections;
  const idle = Array.from({ length: cap }, () => idlePeer(path));
  try {
    await Promise.all(idle.map((p) => p.connected));
    // Accepted in the order they connected: the one after the cap's worth is over it.
    const over = await new Promise<{ ok: boolean; error: { code: string; message: string; details: { limit: number } } }>((resolve, reject) => {
      const s = connect(path);
      const decoder = new FrameDecoder(1 << 20);
      s.on('data', (d) => {
        const [frame] = decoder.push(d);
        if (frame) resolve(parsePayload(frame) as never);
      });
      s.on('error', () => {});
      s.on('close', () => reject(new Error('closed with no reply')));
    });
    assert.is(over.ok, false);
    assert.is(over.error.code, 'E_TOO_MANY_CONNECTIONS');
    assert.is(over.error.details.limit, cap);
    assert.match(over.error.message, new RegExp(`holds ${cap} connections, its most, and refused this one; try again once they are answered \\(an idle one is closed after 60000 ms\\)`));
    assert.equal(calls, []);
  } finally {
    for (const p of idle) p.close();
    server.close();
  }
});

test('a control connection from another uid is closed without a reply, and the daemon logs why', async () => {
  if (process.getuid?.() !== 0) {
    console.log('  (skipped: needs root to run the daemon as a throwaway uid)');
    return;
  }
  const socketDir = mkdtempSync(join(tmpdir(), 'weightd-ctl-uid-'));
  chownSync(socketDir, THROWAWAY_UID, THROWAWAY_UID);
  const child = spawn('setpriv', [`--reuid=${THROWAWAY_UID}`, `--regid=${THROWAWAY_UID}`, '--clear-groups', process.execPath, mainJs, '--model', exampleModel, '--device', 'host', '--weight-cache-socket-dir', socketDir], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, WEIGHTD_HOST_DEVICES: `ctl-uid-${process.pid}` },
  });
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  try {
    await waitUntil(() => `the daemon to be ready (${stderr.slice(-300)})`, () => /"msg":"READY node /.test(stderr), 60_000);
    const control = join(socketDir, `control-${child.pid}.sock`);
    // Root may connect to any socket: it is the foreign peer here.
    const reply = await controlRequest(control, { cmd: 'list' }).then(
      () => 'answered',
      (e: Error) => e.message,
    );
    assert.match(reply, /closed .* without answering|cannot reach the control socket/, 'no reply to another uid');
    await waitUntil('the daemon logs the refusal', () => stderr.includes('control socket: refused a client of another user'));
    assert.match(stderr, /"peerUid":0,.*"uid":48611/);
  } finally {
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
    rmSync(socketDir, { recursive: true, force: true });
  }
});

test.run();
