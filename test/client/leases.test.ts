// Fingerprint checks and lease rules, with clients as separate processes: a mismatch names the
// fields that differ; release is refused while another process maps the rank and allowed once
// it exits; a map lease outlives its connection, a copy lease does not; force revokes.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, WeightdClient, type Expected } from '../../src/client/index.js';
import { ServeError } from '../../src/errors.js';
import { leaseHash } from '../../src/serve/leaseTable.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon, type Daemon } from '../helpers/daemon.js';
import { exampleModel } from '../helpers/paths.js';
import { exitOf, runClient, startHolder, type ClientLanguage } from './runClient.js';

async function withDaemon(fn: (socket: string, expected: Expected, daemon: Daemon) => Promise<void>, env: Record<string, string> = {}): Promise<void> {
  const dir = makeTempDir('lease');
  const daemon = await startDaemon({ model: exampleModel, tp: 1, socketDir: `${dir}/s`, env });
  try {
    await fn(await findSocket({ socketDir: `${dir}/s`, globalRank: 0 }), await expectedFingerprint(exampleModel, 1, 0), daemon);
  } finally {
    await daemon.stop();
    removeDir(dir);
  }
}

async function refusal(p: Promise<unknown>): Promise<ServeError> {
  try {
    await p;
  } catch (err) {
    assert.instance(err, ServeError);
    return err as ServeError;
  }
  return assert.unreachable('expected the daemon to refuse') as never;
}

async function waitFor(what: string, check: () => Promise<boolean>, ms = 5000): Promise<void> {
  const until = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test('a fingerprint mismatch names the fields that differ (ts and python clients)', async () => {
  await withDaemon(async (socket, expected) => {
    for (const lang of ['ts', 'python'] as ClientLanguage[]) {
      const noFields = await runClient<{ mismatch: string[] }>(lang, 'hashes', socket, { fingerprint: 'f'.repeat(64) }, 'map');
      assert.equal(noFields.mismatch, ['fingerprint'], `${lang}: without field hashes only the whole fingerprint can be named`);
      const fields = { ...expected.fingerprintFields!, architecture: 'a'.repeat(64), tpRank: 'b'.repeat(64) };
      const named = await runClient<{ mismatch: string[] }>(lang, 'hashes', socket, { fingerprint: 'e'.repeat(64), fingerprintFields: fields }, 'copy');
      assert.equal(named.mismatch, ['architecture', 'tpRank'], `${lang}: the differing fields`);
    }
    // The wrong rank's fingerprint for this socket: "tpRank" differs, nothing else.
    const client = await WeightdClient.connect(socket);
    const rank1 = await expectedFingerprint(exampleModel, 2, 1);
    const reply = await client.getState(rank1, 'map');
    assert.is(reply.status, 'mismatch');
    if (reply.status === 'mismatch') assert.equal(reply.fields, ['tpRank', 'tpSize']);
    assert.equal((await client.stats()).leases, [], 'a mismatch grants no lease');
    client.close();
  });
});

for (const lang of ['ts', 'python'] as ClientLanguage[]) {
  test(`${lang}: release is refused under another process's lease and allowed after it exits`, async () => {
    await withDaemon(async (socket, expected, daemon) => {
      const { child, line } = await startHolder(lang, socket, expected);
      try {
        const client = await WeightdClient.connect(socket);
        // The holder closed its connection after attaching: its map lease lives on with its pid.
        const stats = await client.stats();
        // Others see a hash of the lease id, never the id, which would let them detach it.
        assert.equal(stats.leases.map((l) => [l.leaseHash, l.pid, l.mode, l.connectionBound]), [[leaseHash(line.leaseId), line.pid, 'map', false]]);
        assert.not.match(JSON.stringify(stats), line.leaseId);
        const refused = await refusal(client.release());
        assert.is(refused.code, 'E_LEASE_HELD');
        assert.match(refused.message, String(line.pid));
        assert.is((await client.ping()).status, 'serving');
        // Another process cannot drop the holder's lease.
        assert.is(await client.detach(line.leaseId), 0);

        child.kill('SIGKILL');
        await exitOf(child);
        const released = await client.release();
        assert.is(released.alreadyReleased, false);
        assert.equal((await client.stats()).leases, []);
        assert.is((await client.ping()).status, 'released');
        assert.is((await refusal(client.getState(expected, 'map'))).code, 'E_RELEASED');
        assert.is((await client.release()).alreadyReleased, true);
        client.close();
        await daemon.waitForStderr('the release in the log', (text) => text.includes('release requested'));
      } finally {
        child.kill('SIGKILL');
      }
    });
  });
}

test("a dead client's lease expires by itself, with nobody asking", async () => {
  await withDaemon(
    async (socket, expected, daemon) => {
      const { child, line } = await startHolder('ts', socket, expected);
      child.kill('SIGKILL');
      await exitOf(child);
      // No request reaches the daemon meanwhile (stats and release also expire dead leases):
      // only the periodic sweep can write this line.
      // The log names the lease by its hash: the id itself would let a reader detach it.
      const ended = new RegExp(`"lease":"${leaseHash(line.leaseId)}".*"msg":"lease ended: client exited"`);
      await daemon.waitForStderr('the sweep to expire the lease', (text) => ended.test(text));
      assert.not.match(daemon.stderr(), line.leaseId);
      const client = await WeightdClient.connect(socket);
      assert.equal((await client.stats()).leases, []);
      client.close();
    },
    { WEIGHTD_SERVE_LEASE_SWEEP_MS: '100' },
  );
});

test('a copy lease ends with its connection; force revokes other leases', async () => {
  await withDaemon(async (socket, expected) => {
    const copier = await WeightdClient.connect(socket);
    const state = await copier.getState(expected, 'copy');
    assert.is(state.status, 'ok');
    const observer = await WeightdClient.connect(socket);
    const leases = (await observer.stats()).leases;
    assert.is(leases.length, 1);
    assert.is(leases[0]!.connectionBound, true);
    copier.close();
    await waitFor('the copy lease to end with its connection', async () => (await observer.stats()).leases.length === 0);

    const { child, line } = await startHolder('python', socket, expected);
    try {
      const forced = await observer.release({ force: true });
      assert.equal(forced.revoked.map((l) => l.pid), [line.pid]);
      assert.is((await observer.ping()).status, 'released');
    } finally {
      child.kill('SIGKILL');
    }
    observer.close();
  });
});

test.run();
