// Owners and expiry: when the process that kept a record exits, the keeper (watching it by
// pidfd) starts the record's expiry, and frees it after --adopt-within unless a new owner takes
// it. Where pidfd_open is refused (a seccomp filter, a kernel before 5.3) the keeper checks each
// owner by the liveness rule instead: one case runs it under such a filter
// (fixtures/without_pidfd_open.py). Each wait polls LIST for the event under a generous bound;
// nothing asserts a duration.
import { closeSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { KeptRecord } from '../../src/keeper/keeperProtocol.js';
import { addon } from '../../src/native/addon.js';
import { fdKinds, memfdWith, startTestKeeper, waitUntil } from '../helpers/keeper.js';
import { repoRoot } from '../helpers/paths.js';
import { runFixture } from '../helpers/runFixture.js';

const keepAndExit = fileURLToPath(new URL('./fixtures/keepAndExit.js', import.meta.url));
const withoutPidfdOpen = join(repoRoot, 'test/keeper/fixtures/without_pidfd_open.py');
// Long enough that the test sees a record between its owner's exit and its expiry.
const ADOPT_WITHIN_S = 3;

/** Runs an owner that keeps `fingerprints` of host-0 (each holding `memfd`) and exits; returns its pid. */
async function keepThenExit(socket: string, memfd: number, fingerprints: string[]): Promise<number> {
  const end = await runFixture(keepAndExit, [socket, 'host-0', `/proc/${process.pid}/fd/${memfd}`, ...fingerprints]);
  assert.is(end.code, 0, `the owner fixture failed: ${end.stdout}`);
  return Number(end.stdout.trim());
}

async function listWhen(list: () => Promise<KeptRecord[]>, what: string, ok: (records: KeptRecord[]) => boolean): Promise<KeptRecord[]> {
  let records: KeptRecord[] = [];
  await waitUntil(() => `${what} (last LIST: ${JSON.stringify(records.map(({ record: _, ...r }) => r))})`, async () => ok((records = await list())));
  return records;
}

test("an owner's exit starts the expiry; the record is freed after adopt-within and its fds closed", async () => {
  const keeper = await startTestKeeper(['--adopt-within', String(ADOPT_WITHIN_S)]);
  const memfd = await memfdWith(Buffer.from('x'));
  try {
    const owner = await keepThenExit(keeper.socket, memfd, ['fp-a']);
    const [r] = await listWhen(() => keeper.client.list(), 'the keeper sees its owner gone', (rs) => rs.length === 0 || !rs[0]!.ownerAlive);
    assert.ok(r, 'the record was still listed after its owner exited');
    assert.is(r!.ownerPid, owner);
    assert.ok(r!.expiresInMs > 0 && r!.expiresInMs <= ADOPT_WITHIN_S * 1000, `expires in ${r!.expiresInMs} ms`);
    await listWhen(() => keeper.client.list(), 'the record is freed', (rs) => rs.length === 0);
    assert.equal({ memfd: fdKinds(keeper.pid).memfd, pidfd: fdKinds(keeper.pid).pidfd }, { memfd: 0, pidfd: 0 });
    assert.match(keeper.stderr(), /"msg":"record expired: nobody took it within adopt-within; its memory is freed","device":"host-0","fingerprint":"fp-a"/);
  } finally {
    closeSync(memfd);
    await keeper.kill();
  }
});

test("a new owner's TAKE cancels the expiry: the record outlives one kept by the same dead owner", async () => {
  const keeper = await startTestKeeper(['--adopt-within', String(ADOPT_WITHIN_S)]);
  const memfd = await memfdWith(Buffer.from('x'));
  try {
    await keepThenExit(keeper.socket, memfd, ['fp-a', 'fp-b']);
    await listWhen(() => keeper.client.list(), 'both records expire', (rs) => rs.every((r) => !r.ownerAlive));
    const taken = await keeper.client.take('host-0', 'fp-a');
    for (const fd of taken.fds) addon().closeFd(fd);
    const owned = (await keeper.client.list()).find((r) => r.fingerprint === 'fp-a');
    assert.equal({ ownerPid: owned?.ownerPid, ownerAlive: owned?.ownerAlive, expiresInMs: owned?.expiresInMs }, { ownerPid: process.pid, ownerAlive: true, expiresInMs: 0 });
    // fp-b's expiry started when fp-a's did: once fp-b is gone, fp-a would have gone too.
    const left = await listWhen(() => keeper.client.list(), 'fp-b is freed', (rs) => !rs.some((r) => r.fingerprint === 'fp-b'));
    assert.equal(left.map((r) => [r.fingerprint, r.ownerAlive]), [['fp-a', true]]);
  } finally {
    closeSync(memfd);
    await keeper.kill();
  }
});

test("without pidfd_open (refused by a seccomp filter) an owner's exit is still seen, by the liveness rule, and a live owner's record stays its own", async () => {
  const keeper = await startTestKeeper(['--adopt-within', '600'], { prefix: [process.env.WEIGHTD_PYTHON ?? 'python3', withoutPidfdOpen] });
  const memfd = await memfdWith(Buffer.from('x'));
  try {
    assert.match(readFileSync(`/proc/${keeper.pid}/status`, 'utf8'), /^Seccomp:\t2$/m, 'the keeper runs under the filter');
    await keeper.client.keep('host-0', 'fp-live', Buffer.from('{}'), [memfd]);
    assert.is(fdKinds(keeper.pid).pidfd, 0, 'it watches this live owner with no pidfd');
    const owner = await keepThenExit(keeper.socket, memfd, ['fp-dead']);
    const records = await listWhen(() => keeper.client.list(), 'the keeper sees the exited owner gone', (rs) => rs.some((r) => r.fingerprint === 'fp-dead' && !r.ownerAlive));
    assert.equal(
      records.map((r) => [r.fingerprint, r.ownerPid, r.ownerAlive]),
      [['fp-dead', owner, false], ['fp-live', process.pid, true]],
    );
    assert.match(keeper.stderr(), /"msg":"owner exited: the record expires unless taken within adopt-within","device":"host-0","fingerprint":"fp-dead"/);
  } finally {
    closeSync(memfd);
    await keeper.kill();
  }
});

test.run();
