// One listener's flood never reaches another's clients (docs/operations.md, "File descriptors"):
// a daemon run with a low RLIMIT_NOFILE, so that a few hundred connections are a flood, is sent
// more connections on its inspect port (loopback TCP, open to every local user) than it has
// descriptors. Its engine still attaches on the device socket, its control socket still answers,
// and /healthz answers once the flood is gone.
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { controlRequest } from '../../src/cli/runCtl.js';
import { errorCode } from '../../src/errors.js';
import { WeightdClient, expectedFingerprint, findSocket } from '../../src/client/index.js';
import { startDaemon } from '../helpers/daemon.js';
import { waitUntil } from '../helpers/keeper.js';
import { exampleModel, freshSocketDir } from '../helpers/paths.js';
import { httpGet } from './httpGet.js';

const LIMIT = 256;
const FLOOD = 400;

/** Opens a connection and leaves it open, sending nothing; resolves once it is connected or refused. */
function floodOne(port: number, open: Socket[]): Promise<void> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    open.push(s);
    s.on('error', () => {});
    s.once('connect', () => resolve());
    s.once('close', () => resolve());
  });
}

/** An engine's attach and detach on rank 0's socket: its status. */
async function attachOnce(socketDir: string): Promise<string> {
  const client = await WeightdClient.connect(await findSocket({ socketDir, globalRank: 0 }));
  try {
    const attached = await client.attach(await expectedFingerprint(exampleModel, 1, 0));
    if (attached.status === 'attached') await attached.detach();
    return attached.status;
  } finally {
    await client.close();
  }
}

test('a flood on the inspect port leaves the device socket and the control socket working; /healthz answers once it is gone', async () => {
  const socketDir = freshSocketDir();
  const daemon = await startDaemon({ model: exampleModel, socketDir, prefix: ['prlimit', `--nofile=${LIMIT}:${LIMIT}`], extraArgs: ['--inspect-port', '0'] });
  const flood: Socket[] = [];
  try {
    const url = /inspect server listening: (http:\/\/127\.0\.0\.1:\d+)\/statechart/.exec(daemon.stderr())![1]!;
    const port = Number(new URL(url).port);
    assert.is((await httpGet(`${url}/healthz`)).status, 200);

    await Promise.all(Array.from({ length: FLOOD }, () => floodOne(port, flood)));
    // A connect resolves once the kernel queued the connection, before the daemon accepted it:
    // wait until the daemon itself has taken the flood, filled its inspect share and refused the rest.
    await daemon.waitForStderr('the daemon took its inspect share of the flood and refused the rest', (text) => /refused an inspect connection/.test(text));
    // The engine attaches, and ctl is answered, while the flood holds what the daemon let it keep.
    // (Failures are compared as text: uvu cannot print an error whose details are an object.)
    assert.is(await attachOnce(socketDir).catch((e: Error) => `${errorCode(e)}: ${e.message}`), 'attached');
    const listed = await controlRequest(join(socketDir, `control-${daemon.pid}.sock`), { cmd: 'list' }).then(
      (r) => (r.ok ? 'answered' : r.error.code),
      (e: Error) => e.message,
    );
    assert.is(listed, 'answered');
    // What the flood holds is the inspect server's share, far from the limit.
    assert.ok(daemon.fdCount() < LIMIT / 2, `the daemon holds ${daemon.fdCount()} descriptors of ${LIMIT}`);

    for (const s of flood) s.destroy();
    await waitUntil('/healthz answers 200 once the flood is gone', async () => (await httpGet(`${url}/healthz`)).status === 200);
  } finally {
    for (const s of flood) s.destroy();
    const { code } = await daemon.stop();
    assert.is(code, 0);
  }
});

test.run();
