// Eviction (docs/operations.md, Eviction): with --evict no-lease-lru, a load that does not fit
// beside the resident models unloads models with no lease, least recently used first, just
// enough, and then loads; a lease protects a model, the node's own included; and when evicting
// every candidate would still not make room, nothing is evicted and the refusal says what could
// have been freed; a segment that versions share (a writer's partial update) is counted once; a
// processed layout no engine maps is dropped before any model is evicted. The
// host's memory is a budget here (modelRankWorker's budgetBytes): what the process's segments hold
// is what is not free.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, WeightdClient, type Attached } from '../../src/client/index.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import type { WeightdError } from '../../src/errors.js';
import { startNode } from '../../src/index.js';
import { writeArchCheckpoint } from '../helpers/checkpoints.js';
import { weightdMemfdBytes, weightdMemfds } from '../helpers/memfds.js';
import { writePartially } from '../helpers/partialWriter.js';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { writeVariant } from '../helpers/variantCheckpoint.js';
import { modelRankWorker } from './fixtures/modelRankWorker.js';
import { publishOverSocket } from '../helpers/publishOverSocket.js';

const log = pino({ level: 'silent' });

/** What a model at tp 1 allocates: its one rank's segments. */
async function bytesOf(dir: string): Promise<number> {
  const plan = await planCheckpoint(dir, { tpSize: 1 });
  return plan.ranks[0]!.segments.reduce((a, b) => a + b, 0);
}

async function attach(socket: string, dir: string): Promise<Attached> {
  const a = await (await WeightdClient.connect(socket)).attach(await expectedFingerprint(dir, 1, 0));
  assert.is(a.status, 'attached', `attached to ${dir}`);
  return a as Attached;
}

/** Until the clock has moved past `ms`, so that what happens next is later by the ms clock. */
async function after(ms: number | undefined): Promise<void> {
  while (Date.now() <= (ms ?? 0)) await new Promise((r) => setImmediate(r));
}

test('a load that does not fit evicts the least recently used model with no lease, just that one, then loads; a lease protects a model, the own one is evicted like any', async () => {
  const dir = freshTempDir();
  const a = writeVariant(exampleModel, `${dir}/a`);
  const b = writeVariant(exampleModel, `${dir}/b`, 0x0f);
  const size = await bytesOf(exampleModel);
  const node = await startNode(
    { model: exampleModel, models: [{ model: a }], evict: 'no-lease-lru', device: 'host', socketDir: freshSocketDir(), logger: log },
    { rankWorker: modelRankWorker({ budgetBytes: Math.floor(2.5 * size) }) },
  );
  try {
    const status = await node.ready;
    const socket = status.ranks[0]!.socketPath!;
    // The own model was used after "a" began serving: "a" is the least recently used.
    await after(status.models[1]!.lastUsedAt);
    await (await attach(socket, exampleModel)).detach();
    assert.ok(node.status().models[0]!.lastUsedAt! > node.status().models[1]!.lastUsedAt!, 'an attach counts as a use');

    const loaded = await node.load({ model: b });
    assert.equal(loaded.evicted.map((e) => [e.name, e.own, e.bytes]), [['a', false, size]], 'one eviction covers the shortfall');
    assert.equal(node.status().models.map((m) => [m.name, m.state]), [['tiny-llama', 'serving'], ['b', 'serving']]);
    assert.is(weightdMemfds().length, 2, "the evicted model's memory is freed");

    // A policy given to one load wins over the node's.
    const refused = await node.load({ model: a }, { evict: 'off' }).catch((e: WeightdError) => e);
    assert.is((refused as WeightdError).code, 'E_DOES_NOT_FIT');
    assert.match((refused as Error).message, /nothing was allocated/);
    assert.is(node.status().models.length, 2, 'nothing was evicted with eviction off');

    // "b" is held by a lease; the own model, though used more recently, holds none.
    const held = await attach(socket, b);
    const again = await node.load({ model: a });
    assert.equal(again.evicted.map((e) => [e.name, e.own]), [['tiny-llama', true]]);
    assert.equal(node.status().models.map((m) => [m.name, m.state, m.leases]), [['tiny-llama', 'released', 0], ['b', 'serving', 1], ['a', 'serving', 0]]);
    assert.is(weightdMemfds().length, 2);
    await held.detach();
  } finally {
    await node.stop();
  }
  assert.equal(weightdMemfds(), []);
});

test('when evicting every model with no lease would not make room, nothing is evicted and the refusal names the bytes needed, free and evictable', async () => {
  const dir = freshTempDir();
  const a = writeVariant(exampleModel, `${dir}/a`);
  const small = `${dir}/small`;
  mkdirSync(small);
  await writeArchCheckpoint(small, 'LlamaForCausalLM');
  const size = await bytesOf(exampleModel);
  const smallSize = await bytesOf(small);
  assert.ok(smallSize < size / 2, 'the small model alone cannot make room');
  const node = await startNode(
    { model: exampleModel, models: [{ model: small }], evict: 'no-lease-lru', device: 'host', socketDir: freshSocketDir(), logger: log },
    { rankWorker: modelRankWorker({ budgetBytes: size + smallSize + Math.floor(size / 2) }) },
  );
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    const held = await attach(socket, exampleModel);
    const refused = await node.load({ model: a }).catch((e: WeightdError) => e);
    assert.is((refused as WeightdError).code, 'E_DOES_NOT_FIT');
    const d = (refused as WeightdError).details;
    assert.equal([d.neededBytes, d.evictableBytes, d.candidates], [size, smallSize, ['small']]);
    assert.match(
      (refused as Error).message,
      new RegExp(`model "a" does not fit even if every model with no lease were evicted \\(--evict no-lease-lru\\): its ranks need ${size} bytes .* of host memory, which has \\d+ bytes .* free and ${smallSize} bytes .* in models with no lease \\(small\\) and processed layouts no engine maps; nothing was evicted or allocated`),
    );
    assert.equal(node.status().models.map((m) => [m.name, m.state]), [['tiny-llama', 'serving'], ['small', 'serving']], 'nothing was evicted');
    assert.is(weightdMemfds().length, 2);
    await held.detach();
  } finally {
    await node.stop();
  }
  assert.equal(weightdMemfds(), []);
});

test('a segment two versions share (a partial update) is counted once: evicting only the older would free just what it does not share, so both go', async () => {
  const dir = freshTempDir();
  const planFile = join(dir, 'plan.json');
  writeFileSync(planFile, JSON.stringify({ rules: [], segmentBytes: 1 << 20 }));
  const x = writeVariant(exampleModel, `${dir}/x`, 0x0f);
  const plan = (await planCheckpoint(exampleModel, { tpSize: 1, planFile })).ranks[0]!;
  const size = plan.segments.reduce((a, b) => a + b, 0);
  const written = plan.segments[1]!;
  const tensor = plan.tensors.find((t) => t.segment === 1)!.name;
  const needed = await bytesOf(x);
  assert.ok(plan.segments.length > 2 && written < needed / 2, 'the base is cut into several segments, one of them small beside the model');
  // Held once the writer committed: the base and the one copied segment. Free then: half of what
  // "x" needs. Evicting the base alone frees only its segment the writer replaced.
  const free = Math.floor(needed / 2);
  const node = await startNode(
    { model: exampleModel, planFile, keepVersions: 1, evict: 'no-lease-lru', device: 'host', socketDir: freshSocketDir(), logger: log },
    { rankWorker: modelRankWorker({ budgetBytes: free + size + written }) },
  );
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    assert.is((await writePartially(socket, 'tiny-llama', tensor)).version, 1);
    assert.equal(node.status().models.map((m) => [m.name, m.version, m.state, m.current]), [['tiny-llama', 0, 'serving', false], ['tiny-llama', 1, 'serving', true]]);
    assert.is(weightdMemfdBytes(), size + written, 'the versions share every segment but the one written');

    const loaded = await node.load({ model: x });
    assert.equal(loaded.evicted.map((e) => e.name), ['tiny-llama', 'tiny-llama'], 'the base and the version sharing its segments');
    assert.equal(node.status().models.filter((m) => m.state === 'serving').map((m) => m.name), ['x']);
  } finally {
    await node.stop();
  }
  assert.equal(weightdMemfds(), []);
});

test('a processed layout no engine maps is dropped to make room before any model is evicted; status shows it until then', async () => {
  const dir = freshTempDir();
  const small = `${dir}/small`;
  mkdirSync(small);
  await writeArchCheckpoint(small, 'LlamaForCausalLM');
  const size = await bytesOf(exampleModel);
  const smallSize = await bytesOf(small);
  const layoutBytes = 64 << 10;
  // Free once the layout is published: one byte short of "small"; the own model is leased.
  const node = await startNode(
    { model: exampleModel, evict: 'no-lease-lru', device: 'host', socketDir: freshSocketDir(), logger: log },
    { rankWorker: modelRankWorker({ budgetBytes: size + layoutBytes + smallSize - 1 }) },
  );
  try {
    const socket = (await node.ready).ranks[0]!.socketPath!;
    const held = await attach(socket, exampleModel);
    const key = 'e'.repeat(32);
    const base = (await expectedFingerprint(exampleModel, 1, 0)).fingerprint;
    const committed = await publishOverSocket(socket, { model: 'tiny-llama', base, key, tensors: [{ name: 'w#t', dtype: 'U8', shape: [layoutBytes] }] });
    assert.is(committed.ok, true, JSON.stringify(committed));
    const own = node.status().models[0]!;
    assert.equal(own.ranks[0]!.processed?.map((p) => [p.key, p.base, p.bytes, p.leases]), [[key, base, layoutBytes, 0]], 'status lists the layout beside its rank');
    assert.is(own.processedBytes, layoutBytes);
    assert.ok(Math.abs(own.ranks[0]!.processed![0]!.publishedAt - Date.now()) < 60_000);

    const loaded = await node.load({ model: small });
    assert.equal(loaded.evicted, [], 'no model was evicted: dropping the layout made room');
    assert.equal(node.status().models.map((m) => [m.name, m.state, m.processedBytes]), [['tiny-llama', 'serving', 0], ['small', 'serving', 0]]);
    assert.equal(weightdMemfds().filter((f) => f.startsWith('/memfd:weightd:processed:')), [], "the layout's memory is freed");
    await held.detach();
  } finally {
    await node.stop();
  }
  assert.equal(weightdMemfds(), []);
});

test.run();
