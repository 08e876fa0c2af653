// A daemon that will not serve a connection (its connection cap) says why in a frame of id null
// and closes it, often before the client has sent anything. The TypeScript client reports that
// refusal as the reply to its next request, as the Python client does, instead of dropping the
// frame and sending the request on a new connection.
import { createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { WeightdClient } from '../../src/client/index.js';
import { ServeError } from '../../src/errors.js';
import { encodeMessage } from '../../src/wire/frameCodec.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';

test('a refusal read before the first request is that request\'s answer', async () => {
  const dir = makeTempDir('refusal-first');
  const socketPath = join(dir, 'rank.sock');
  let connections = 0;
  let refusedClosed!: () => void;
  const closed = new Promise<void>((resolve) => (refusedClosed = resolve));
  // The first connection is refused at once; any later one is hung up on, so a request sent
  // again on a new connection fails otherwise.
  const server = createServer((socket: Socket) => {
    if (++connections > 1) return void socket.destroy();
    socket.on('close', refusedClosed);
    socket.resume();
    socket.end(encodeMessage({ id: null, ok: false, error: { code: 'E_TOO_MANY_CONNECTIONS', message: 'refused (2 connections are open, its most)', details: { limit: 2 } } }));
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  try {
    const client = await WeightdClient.connect(socketPath);
    // The server's side closes once the client, having read the refusal and the end, closed its own.
    await closed;
    const refused = await client.ping().then(
      () => undefined,
      (err: unknown) => err,
    );
    client.close();
    assert.instance(refused, ServeError);
    assert.is((refused as ServeError).code, 'E_TOO_MANY_CONNECTIONS');
    assert.equal((refused as ServeError).details, { limit: 2 });
    assert.is(connections, 1, 'the request was not sent again on a new connection');
  } finally {
    await new Promise<void>((resolve) => server.close(() => resolve()));
    removeDir(dir);
  }
});

test.run();
