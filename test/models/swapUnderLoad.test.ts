// A swap to a new checkpoint while 32 client processes keep attaching to every rank of a tp-2
// model (test/models/swapClient.ts): each attachment holds one version on both ranks (never a
// mix), the old version takes no new lease once the new one serves and points its clients to it,
// no lease ends under its holder, and the old version's memory is freed only once none is held.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint } from '../../src/client/index.js';
import { startNode } from '../../src/index.js';
import { weightdMemfds } from '../helpers/memfds.js';
import { exampleModel, freshSocketDir, freshTempDir, repoRoot } from '../helpers/paths.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import type { SwapReport, SwapVersion } from './swapClient.js';

const CLIENTS = 32;
const TP = 2;
/** A column-parallel, a row-parallel (strided) and a replicated tensor: what a mix would show. */
const CHECKED = ['model.embed_tokens.weight', 'model.layers.0.self_attn.o_proj.weight', 'model.norm.weight'];

async function version(name: string, dir: string): Promise<SwapVersion> {
  const fingerprints = [];
  const hashes = [];
  for (let r = 0; r < TP; r++) {
    fingerprints.push((await expectedFingerprint(dir, TP, r)).fingerprint);
    const expected = expectedRank(dir, TP, r);
    hashes.push(Object.fromEntries(CHECKED.map((t) => [t, expected.get(t)!.sha256])));
  }
  return { name, fingerprints, hashes };
}

function startClient(versions: SwapVersion[], sockets: string[]) {
  const child = spawn(process.execPath, [join(repoRoot, 'dist/test/models/swapClient.js'), JSON.stringify(versions), JSON.stringify(sockets)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  let warmed: () => void;
  const warm = new Promise<void>((resolve) => (warmed = resolve));
  child.stdout.on('data', (d: Buffer) => {
    out += d;
    if (out.startsWith('warm\n')) warmed();
  });
  child.stderr.on('data', (d: Buffer) => (err += d));
  const report = new Promise<SwapReport>((resolve, reject) =>
    // 'close', not 'exit': the report's last chunk may still be in the pipe when the process exits.
    child.on('close', (code) => (code === 0 ? resolve(JSON.parse(out.trim().split('\n').pop()!) as SwapReport) : reject(new Error(`swap client exited ${code}:\n${err}`)))),
  );
  report.catch(() => warmed());
  return { child, warm, report };
}

test(`a swap while ${CLIENTS} clients attach: one version per attachment, no new lease on the old, freed only once no lease holds it`, async () => {
  const v2dir = writeVariant(exampleModel, `${freshTempDir()}/v2`);
  const versions = [await version('v1', exampleModel), await version('v2', v2dir)];
  const node = await startNode({ model: exampleModel, tensorParallelSize: TP, device: 'host', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }) });
  const clients: Array<ReturnType<typeof startClient>> = [];
  /** Per local rank of the old version: the leases it held when it was freed. */
  const leasesAtRelease: Record<number, number> = {};
  try {
    const sockets = (await node.ready).ranks.map((r) => r.socketPath!);
    // Each rank of the old version drains on its own: when one is freed, no lease of it may be left.
    const offEvents = node.onEvent((e) => {
      const localRank = (e.data as { localRank?: number } | undefined)?.localRank;
      if (e.type === 'RANK_RELEASED' && localRank !== undefined) leasesAtRelease[localRank] = node.status().models[0]!.ranks[localRank]!.leases ?? 0;
    });
    for (let i = 0; i < CLIENTS; i++) clients.push(startClient(versions, sockets));
    await Promise.all(clients.map((c) => c.warm));
    const loaded = await node.load({ model: v2dir, name: 'tiny-llama', tensorParallelSize: TP });
    assert.is(loaded.alreadyLoaded, false);
    const reports = await Promise.all(clients.map((c) => c.report));
    offEvents();
    const sum = (f: (r: SwapReport) => number) => reports.reduce((n, r) => n + f(r), 0);
    assert.equal(reports.flatMap((r) => r.mixes), [], 'no attachment mixed two versions');
    assert.ok(sum((r) => r.attaches.v1 ?? 0) >= 2 * CLIENTS && sum((r) => r.attaches.v2 ?? 0) === 3 * CLIENTS, 'every client attached both versions');
    assert.is(sum((r) => r.endedUnderHolder), 0, 'no lease ended under its holder: the old memory was never freed while held');
    console.log(`  ${sum((r) => r.attaches.v1 ?? 0)} attaches of v1, ${sum((r) => r.attaches.v2 ?? 0)} of v2, ${sum((r) => r.drainingRefusals)} refused while v1 drained`);
    await new Promise<void>((resolve) => {
      const check = () => node.status().models[0]!.state === 'released' && (off(), resolve());
      const off = node.onEvent(check);
      check();
    });
    assert.equal(leasesAtRelease, { 0: 0, 1: 0 }, 'each rank of the old version was freed with no lease of it held');
    assert.is(weightdMemfds().length, TP, "only the new version's segments are left");
  } finally {
    for (const c of clients) c.child.kill('SIGKILL');
    await node.stop();
  }
  assert.equal(weightdMemfds(), []);
});

test.run();
