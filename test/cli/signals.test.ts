// Every signal a supervisor, a terminal or a closed session sends to end a process (HUP, INT,
// TERM, QUIT) stops the daemon cleanly, whatever it is doing: exit 0, and no socket, lock,
// node.json left (its segments are memfds: nothing of them can outlive the process). A second SIGINT while stopping changes nothing.
import { readdirSync, rmSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import { READY_LINE, startDaemon, type DaemonOptions } from '../helpers/daemon.js';
import { exampleModel, freshSocketDir, mainJs } from '../helpers/paths.js';
import { freePort } from '../../src/nodeOptions.js';

const SIGNALS = ['SIGHUP', 'SIGINT', 'SIGTERM', 'SIGQUIT'] as const;

/** Starts a daemon, waits for `until`, sends `signals` (each after `between` matched), checks the end. */
async function signalled(signals: NodeJS.Signals[], opts: Partial<DaemonOptions> & { until?: RegExp; between?: RegExp }) {
  const socketDir = freshSocketDir();
  try {
    const d = await startDaemon({ model: exampleModel, tp: 2, socketDir, ...opts, extraArgs: ['--log-level', 'debug', ...(opts.extraArgs ?? [])] });
    const [first, ...rest] = signals;
    const exit = d.stop(10_000, first);
    for (const s of rest) {
      await d.waitFor(opts.between ?? /"msg":"stopping"/);
      process.kill(d.pid, s);
    }
    const { code, signal } = await exit;
    assert.equal({ code, signal }, { code: 0, signal: null }, d.stderr());
    assert.equal(readdirSync(socketDir), [], 'no socket, lock or node.json left');
    assert.match(d.stderr(), new RegExp(`"reason":"${first}"`), 'the stop names the signal');
    return d.stderr();
  } finally {
    rmSync(socketDir, { recursive: true, force: true });
  }
}

for (const s of SIGNALS) {
  test(`${s} while serving: a clean stop`, async () => {
    await signalled([s], {});
  });

  // Node 0 of two waits for node 1, which never comes: it holds its device locks meanwhile.
  test(`${s} before serving, locks held (waiting for a peer): a clean stop`, async () => {
    const log = await signalled([s], {
      until: /"state":"rendezvous"/,
      extraArgs: ['--nnodes', '2', '--node-rank', '0', '--weight-cache-master-port', String(await freePort()), '--rendezvous-timeout', '600'],
      tp: 2,
      devices: [`sig-${process.pid}-a`],
    });
    assert.match(log, /"from":"rendezvous"/);
  });
}

// The load runs from this line until the ranks report loaded (a worker per rank starts, loads
// the addon and copies), so the first signal lands in it; the checks hold in any state.
test('SIGINT during loading, then SIGINT again while stopping: a clean stop, no lock left', async () => {
  await signalled(['SIGINT', 'SIGINT'], { until: /"state":"loading"/ });
});

test('SIGHUP during loading: a clean stop', async () => {
  await signalled(['SIGHUP'], { until: /"state":"loading"/ });
});

// A closed terminal or SSH session: stderr's reader is gone before the HUP arrives, so every
// later log line fails with EPIPE. The stop must still remove everything.
test('SIGHUP after stderr was closed (a closed session): a clean stop', async () => {
  const socketDir = freshSocketDir();
  try {
    const child = spawn(process.execPath, [mainJs, '--model', exampleModel, '--device', 'host', '--weight-cache-socket-dir', socketDir], {
      env: { ...process.env, WEIGHTD_HOST_DEVICES: `hup-${process.pid}` },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    const exit = new Promise<{ code: number | null; signal: string | null }>((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
    let text = '';
    await new Promise<void>((resolve) => {
      child.stderr.on('data', (d: Buffer) => {
        text += d.toString();
        if (READY_LINE.test(text)) resolve();
      });
    });
    child.stderr.destroy();
    child.kill('SIGHUP');
    assert.equal(await exit, { code: 0, signal: null });
    assert.equal(readdirSync(socketDir), [], 'no socket, lock or node.json left');
  } finally {
    rmSync(socketDir, { recursive: true, force: true });
  }
});

test.run();
