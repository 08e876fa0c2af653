// A client of the daemon's own user refused at a device socket's connection cap is told why
// (E_TOO_MANY_CONNECTIONS, as the reply to its first request), in both clients, instead of seeing
// the daemon hang up; once a held connection closes, the next client is served.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { findSocket, WeightdClient } from '../../src/client/index.js';
import { ServeError } from '../../src/errors.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon } from '../helpers/daemon.js';
import { waitUntil } from '../helpers/keeper.js';
import { exampleModel, repoRoot } from '../helpers/paths.js';

const CAP = 2;

test('a client over the cap hears E_TOO_MANY_CONNECTIONS naming the limit, in TypeScript and in Python', async () => {
  const dir = makeTempDir('cap-refusal');
  const daemon = await startDaemon({ model: exampleModel, socketDir: dir, env: { WEIGHTD_SERVE_MAX_CONNECTIONS: String(CAP) } });
  const held: WeightdClient[] = [];
  try {
    const socket = await findSocket({ socketDir: dir, globalRank: 0 });
    // Held by clients the daemon has answered (so it admitted them: a connect alone resolves in
    // the kernel's backlog), each watching a model so that no idle timeout closes it.
    for (let i = 0; i < CAP; i++) {
      const c = await WeightdClient.connect(socket);
      held.push(c);
      await c.watch('tiny-llama');
    }
    const over = await WeightdClient.connect(socket);
    const refused = await over.ping().then(
      () => undefined,
      (err: unknown) => err,
    );
    over.close();
    assert.instance(refused, ServeError);
    assert.is((refused as ServeError).code, 'E_TOO_MANY_CONNECTIONS');
    assert.match((refused as ServeError).message, new RegExp(`${CAP} connections are open, its most\\); try again once others close`));
    assert.equal((refused as ServeError).details, { limit: CAP });

    const python = spawnSync(
      process.env.WEIGHTD_PYTHON ?? 'python3',
      ['-c', 'import sys\nfrom weightd_client.client import WeightdClient\ntry:\n    WeightdClient(sys.argv[1]).ping()\nexcept Exception as e:\n    print(e.code, e.details)', socket],
      { env: { ...process.env, PYTHONPATH: join(repoRoot, 'clients/python') }, encoding: 'utf8', timeout: 60_000 },
    );
    assert.is(python.stdout.trim(), `E_TOO_MANY_CONNECTIONS {'limit': ${CAP}}`, python.stderr);

    // The daemon sees the close on its own time: the one connection still held, a bystander
    // watching, reads the count of open connections until the closed one is gone from it.
    const bystander = held[0]!;
    held.pop()!.close();
    await waitUntil(`the daemon counts ${CAP - 1} open connection after one closed`, async () => (await bystander.stats()).connections === CAP - 1);
    const next = await WeightdClient.connect(socket);
    assert.is((await next.ping()).ok, true);
    next.close();
  } finally {
    for (const c of held) c.close();
    await daemon.stop();
    removeDir(dir);
  }
});

test.run();
