// Which of a rank's tensors the fill's digests (of the checkpoint's tensors, as files hold them)
// prove (src/checkpoint/arenaTensorDigests.ts): a tensor copied whole from its checkpoint tensor
// takes that tensor's digest; a tp shard, a piece of a checkpoint tensor, takes none.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { arenaTensorDigests } from '../../src/checkpoint/arenaTensorDigests.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { exampleModel } from '../helpers/paths.js';

test('at tp 1 every tensor is its checkpoint tensor copied whole: each takes that tensor\'s digest', async () => {
  const rank = (await planCheckpoint(exampleModel, { tpSize: 1, layouts: [] })).ranks[0]!;
  // A digest per checkpoint tensor that names it: the one each rank tensor takes says whose it is.
  const digests = arenaTensorDigests(rank, rank.contentTensors.names);
  assert.equal(digests, rank.tensors.map((t) => t.name));
});

test('at tp 2 a shard takes no digest, a tensor every rank holds whole takes its own', async () => {
  const rank = (await planCheckpoint(exampleModel, { tpSize: 2, layouts: [] })).ranks[1]!;
  const digests = arenaTensorDigests(rank, rank.contentTensors.names);
  const sharded = rank.tensors.filter((t) => t.fullShape !== undefined && t.fullShape.join() !== t.shape.join());
  assert.ok(sharded.length > 0 && sharded.length < rank.tensors.length, 'the example has shards and whole tensors at tp 2');
  for (const [i, t] of rank.tensors.entries()) assert.is(digests[i], sharded.includes(t) ? undefined : t.name, t.name);
});

test.run();
