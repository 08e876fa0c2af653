// Several models in one daemon (docs/operations.md, Several models): two checkpoints at tp 2 and
// tp 1 share the device sockets, and get_state finds each by the fingerprint the client sends;
// status and node.json list both; a new version of a name loads beside the old and takes its
// place once resident; and every bad input is refused with what to do, the others serving on.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, readNodeManifest, WeightdClient, type Attached } from '../../src/client/index.js';
import { RankFailedError, UsageError, WeightdError } from '../../src/errors.js';
import { startNode, type WeightdNode } from '../../src/index.js';
import type { HostTensor } from '../../src/client/segmentAccess.js';
import { weightdMemfds } from '../helpers/memfds.js';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import { modelRankWorker } from './fixtures/modelRankWorker.js';
import { cpSync } from 'node:fs';

const log = pino({ level: 'silent' });

function bytesOf(t: HostTensor): Buffer {
  return Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

/** Every tensor of an attachment equals the oracle's rank `rank` of `dir` at `tp`. */
function assertHolds(a: Attached, dir: string, tp: number, rank: number, what: string): void {
  const expected = expectedRank(dir, tp, rank);
  assert.ok(a.backend === 'host');
  for (const [name, e] of expected) {
    const t = (a.tensors as Record<string, HostTensor>)[name];
    assert.ok(t, `${what}: ${name} is served`);
    assert.ok(bytesOf(t).equals(e.bytes), `${what}: ${name} holds its bytes`);
  }
}

async function attach(socket: string, dir: string, tp: number, rank: number): Promise<Attached> {
  const client = await WeightdClient.connect(socket);
  const a = await client.attach(await expectedFingerprint(dir, tp, rank));
  assert.is(a.status, 'attached', `attached to ${dir} tp ${tp} rank ${rank}`);
  return a as Attached;
}

async function until(what: string, check: () => boolean, node: WeightdNode): Promise<void> {
  if (check()) return;
  await new Promise<void>((resolve, reject) => {
    const off = node.onEvent(() => {
      if (!check()) return;
      off();
      resolve();
    });
    void node.done.then(() => reject(new Error(`the node ended before ${what}`)));
  });
}

test('two models at tp 2 and tp 1 share the device sockets; each is found by its fingerprint; status and node.json list both', async () => {
  const dir = freshTempDir();
  const draft = `${dir}/draft`;
  cpSync(exampleModel, draft, { recursive: true });
  const socketDir = freshSocketDir();
  const node = await startNode({ model: exampleModel, tensorParallelSize: 2, models: [{ model: draft, tensorParallelSize: 1 }], device: 'host', socketDir, logger: log });
  try {
    const status = await node.ready;
    assert.equal(status.models.map((m) => [m.name, m.own, m.state, m.tpSize, m.ranks.length]), [
      ['tiny-llama', true, 'serving', 2, 2],
      ['draft', false, 'serving', 1, 1],
    ]);
    for (const m of status.models) assert.is(m.bytes, m.ranks.reduce((n, r) => n + r.totalBytes, 0), `${m.name}: every byte resident`);
    const socket0 = status.ranks[0]!.socketPath!;
    assert.is(status.models[1]!.ranks[0]!.socketPath, socket0, "the draft's rank is served on device 0's one socket");
    assert.is(weightdMemfds().length, 3, 'one segment per rank of each model');

    const manifest = readNodeManifest(socketDir)!;
    assert.equal(manifest.models?.map((m) => [m.name, m.tpSize, m.ranks.map((r) => r.socketPath)]), [
      ['tiny-llama', 2, [socket0, status.ranks[1]!.socketPath]],
      ['draft', 1, [socket0]],
    ]);
    assert.equal(manifest.ranks.map((r) => r.globalRank), [0, 1], "the node's own ranks, as before several models");

    const own = await attach(socket0, exampleModel, 2, 0);
    const other = await attach(socket0, draft, 1, 0);
    assertHolds(own, exampleModel, 2, 0, 'tp 2 rank 0');
    assertHolds(other, draft, 1, 0, 'tp 1 rank 0');
    const ping = await (await WeightdClient.connect(socket0)).ping();
    assert.equal(ping.models?.map((m) => [m.name, m.tpSize, m.status]), [['tiny-llama', 2, 'serving'], ['draft', 1, 'serving']]);
    assert.is(ping.name, 'tiny-llama', "a ping that names no version is about the node's own model");
    assert.is(node.status().models[1]!.leases, 1, "the draft's lease is counted on it");
    await own.detach();
    await other.detach();
  } finally {
    await node.stop();
  }
  assert.equal(weightdMemfds(), [], 'every model freed at stop');
});

test('a new version loads beside the old, serves once resident, and the old is freed when its last lease ends', async () => {
  const dir = freshTempDir();
  const v2 = writeVariant(exampleModel, `${dir}/tiny-llama-v2`);
  const node = await startNode({ model: exampleModel, tensorParallelSize: 1, device: 'host', socketDir: freshSocketDir(), logger: log });
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    const old = await attach(socket, exampleModel, 1, 0);
    const loaded = await node.load({ model: v2, name: 'tiny-llama', tensorParallelSize: 1 });
    assert.is(loaded.alreadyLoaded, false);
    assert.is(loaded.model.state, 'serving');
    assert.equal(node.status().models.map((m) => [m.name, m.state]), [['tiny-llama', 'draining'], ['tiny-llama', 'serving']], 'both versions are resident while a lease holds the old');
    // The old version takes no new lease, and says which version to move to.
    const refused = await (await WeightdClient.connect(socket)).getState(await expectedFingerprint(exampleModel, 1, 0), 'map').catch((e: WeightdError) => e);
    assert.instance(refused, WeightdError);
    assert.is((refused as WeightdError).code, 'E_DRAINING');
    assert.is((refused as WeightdError).details.newer, await expectedFingerprint(v2, 1, 0).then((e) => e.fingerprint));
    const fresh = await attach(socket, v2, 1, 0);
    assertHolds(fresh, v2, 1, 0, 'the new version');
    assertHolds(old, exampleModel, 1, 0, 'the old version, still held');
    assert.is(weightdMemfds().length, 2);
    await old.detach();
    await until('the old version is released', () => node.status().models[0]!.state === 'released', node);
    assert.is(weightdMemfds().length, 1, "the old version's memory is freed once its last lease ended");
    await fresh.detach();

    // Loading it again is a no-op that says so.
    const again = await node.load({ model: v2, name: 'tiny-llama' });
    assert.is(again.alreadyLoaded, true);
    assert.is(weightdMemfds().length, 1, 'nothing allocated for a model already loaded');
  } finally {
    await node.stop();
  }
  assert.equal(weightdMemfds(), []);
});

test('a checkpoint unloaded and loaded again serves again, on the socket where its released load still answers', async () => {
  const node = await startNode({ model: exampleModel, device: 'host', socketDir: freshSocketDir(), logger: log });
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    await node.unload('tiny-llama');
    await until('the unloaded model is released', () => node.status().models[0]!.state === 'released', node);
    assert.equal(weightdMemfds(), []);
    const again = await node.load({ model: exampleModel });
    assert.is(again.alreadyLoaded, false, 'a released model is not loaded');
    const a = await attach(socket, exampleModel, 1, 0);
    assertHolds(a, exampleModel, 1, 0, 'the load after the release');
    // Both versions have the one fingerprint: each counts its own leases, not the other's.
    assert.equal(node.status().models.map((m) => [m.name, m.own, m.state, m.leases, m.ranks[0]!.serve]), [
      ['tiny-llama', true, 'released', 0, 'released'],
      ['tiny-llama', false, 'serving', 1, 'serving'],
    ]);
    await a.detach();
    assert.equal(node.status().models.map((m) => m.leases), [0, 0]);
  } finally {
    await node.stop();
  }
});

test('bad input: the same name twice, several models in a group, a checkpoint loaded under another name, an unknown unload', async () => {
  const dir = freshTempDir();
  const copy = `${dir}/copy/tiny-llama`;
  cpSync(exampleModel, copy, { recursive: true });
  await startNode({ model: exampleModel, models: [{ model: copy }], device: 'host', logger: log }).then(
    () => assert.unreachable('two models of one name must be refused'),
    (e: UsageError) => {
      assert.instance(e, UsageError);
      assert.match(e.message, /the same name "tiny-llama" as .*tiny-llama; give each model its own name/);
    },
  );
  await startNode({ model: exampleModel, tensorParallelSize: 2, nnodes: 2, weightCacheMasterPort: 29777, models: [{ model: copy, name: 'other' }], device: 'host', logger: log }).then(
    () => assert.unreachable('a group starts with one model'),
    (e: UsageError) => assert.match(e.message, /a second model, but a node of a group \(--nnodes > 1\) starts with one model; start the group with its first model, then run weightd ctl load --model DIR on every node/),
  );
  const node = await startNode({ model: exampleModel, device: 'host', socketDir: freshSocketDir(), logger: log });
  try {
    await node.ready;
    const renamed = await node.load({ model: copy, name: 'again' }).catch((e: Error) => e);
    assert.instance(renamed, UsageError);
    assert.match((renamed as Error).message, /is already loaded as "tiny-llama"/);
    const unknown = await node.unload('nope').catch((e: Error) => e);
    assert.instance(unknown, WeightdError);
    assert.is((unknown as WeightdError).code, 'E_UNKNOWN_MODEL');
    assert.match((unknown as Error).message, /no loaded model is named or fingerprinted "nope"; loaded: tiny-llama \(/);
    const badName = await node.load({ model: copy, name: '../x' }).catch((e: Error) => e);
    assert.instance(badName, UsageError);
    assert.match((badName as Error).message, /--name "..\/x": is not a model name/);
    assert.equal(node.status().models.map((m) => m.state), ['serving'], 'the node serves on');
  } finally {
    await node.stop();
  }
});

test('a load that does not fit is refused before anything is allocated, naming the bytes needed and free', async () => {
  const dir = freshTempDir();
  const v2 = writeVariant(exampleModel, `${dir}/v2`);
  const node = await startNode({ model: exampleModel, device: 'host', socketDir: freshSocketDir(), logger: log }, { rankWorker: modelRankWorker({ freeBytes: 4096 }) });
  try {
    await node.ready;
    const refused = await node.load({ model: v2 }).catch((e: Error) => e);
    assert.instance(refused, RankFailedError);
    assert.is((refused as WeightdError).code, 'E_DOES_NOT_FIT');
    assert.match((refused as Error).message, /model "v2" does not fit beside what is resident: its ranks need \d+ bytes \(.* GiB\) of host memory, which has 4096 bytes \(0\.00 GiB\) free; nothing was allocated/);
    assert.is(weightdMemfds().length, 1, 'only the resident model holds memory');
    assert.equal(node.status().models.map((m) => [m.name, m.state]), [['tiny-llama', 'serving']]);
  } finally {
    await node.stop();
  }
});

test('a directory that changes during its load fails that load alone; the resident model serves on', async () => {
  const dir = freshTempDir();
  const v2 = writeVariant(exampleModel, `${dir}/v2`);
  const node = await startNode({ model: exampleModel, device: 'host', socketDir: freshSocketDir(), logger: log }, { rankWorker: modelRankWorker({ growFile: true }) });
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    const failed = await node.load({ model: v2, name: 'tiny-llama' }).catch((e: Error) => e);
    assert.instance(failed, WeightdError);
    assert.is((failed as WeightdError).code, 'E_FILE_CHANGED');
    assert.match((failed as Error).message, /model "tiny-llama".*: checkpoint files changed while (the model|rank 0) loaded \(model-0000\d-of-00002\.safetensors: size \d+ -> \d+ \(resized\)\)/);
    assert.equal(node.status().models.map((m) => [m.name, m.state]), [['tiny-llama', 'serving']], 'the old version was not drained for a load that failed');
    const still = await attach(socket, exampleModel, 1, 0);
    assertHolds(still, exampleModel, 1, 0, 'the resident version');
    await still.detach();
    assert.is(weightdMemfds().length, 1);
  } finally {
    await node.stop();
  }
});

test.run();
