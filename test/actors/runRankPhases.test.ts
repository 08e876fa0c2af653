// The rank worker's phases as its thread runs them (src/actors/runRankPhases.ts): a device whose
// open settles after a RELEASE or STOP was never stored by the machine, so the open itself frees
// it, and nothing it says reaches the main thread after the rank was released or stopped. An adopt
// in progress is waited for before the device is freed.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { startRankMachine } from '../../src/actors/runRankPhases.js';
import type { RankPhases } from '../../src/actors/rankPhases.js';
import type { RankToMain, RankWorkerData } from '../../src/models/rankMessages.js';
import type { DeviceHandle } from '../../src/native/deviceHandle.js';

const data = { nodeRank: 0, localRank: 0, globalRank: 0, plan: { segments: [256], totalBytes: 256 } } as unknown as RankWorkerData;
/** Every microtask the settled open queued has run once the next macrotask starts. */
const settled = () => new Promise<void>((resolve) => setImmediate(resolve));

/** A started rank worker running `phases` as its thread would, and what it posts. */
function startWorker(phases: RankPhases) {
  const posts: RankToMain[] = [];
  const { actor } = startRankMachine(phases, data, (m) => void posts.push(m), () => {});
  return { actor, posts };
}

for (const type of ['RELEASE', 'STOP'] as const) {
  test(`a device opened after a ${type} is freed, and its DEVICE message is not posted`, async () => {
    let frees = 0;
    const device = { info: () => ({}), free: async () => void frees++, cancelFill: () => {} } as unknown as DeviceHandle;
    let open!: () => void;
    const phases = {
      open: (_: RankWorkerData, post: (m: RankToMain) => void) =>
        new Promise<DeviceHandle>((resolve) => {
          open = () => {
            post({ type: 'DEVICE', info: device.info() } as RankToMain);
            resolve(device);
          };
        }),
    } as unknown as RankPhases;
    const { actor, posts } = startWorker(phases);
    actor.send({ type });
    await settled();
    open();
    await settled();
    assert.is(frees, 1, 'the device the late open made is freed');
    assert.equal(
      posts.map((m) => m.type),
      type === 'RELEASE' ? ['RELEASED'] : [],
      'nothing is posted after the rank was released or stopped',
    );
    actor.stop();
  });
}

test('a RELEASE during an adopt frees the device only once the adopt is done', async () => {
  const order: string[] = [];
  const device = { info: () => ({}), free: async () => void order.push('free'), cancelFill: () => {} } as unknown as DeviceHandle;
  let adopt!: () => void;
  const phases = {
    open: async () => device,
    adopt: () =>
      new Promise<undefined>((resolve) => {
        adopt = () => {
          order.push('adopted');
          resolve(undefined);
        };
      }),
  } as unknown as RankPhases;
  const { actor, posts } = startWorker(phases);
  await settled();
  assert.ok(actor.getSnapshot().matches({ rank: 'adopting' }), 'the adopt is in progress');
  actor.send({ type: 'RELEASE' });
  await settled();
  assert.equal(order, [], 'nothing is freed under the adopt');
  adopt();
  await settled();
  assert.equal(order, ['adopted', 'free']);
  assert.equal(posts.map((m) => m.type), ['RELEASED']);
  actor.stop();
});

test.run();
