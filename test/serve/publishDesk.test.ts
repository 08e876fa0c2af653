// The publish desk in-process, on a real host rank (publishDesk.ts): a publish places the tensors
// aligned in one fresh memfd, commit seals and digests it into the rank's processed layouts, and
// the rank's release closes it; what it refuses (a second key, past the cap, a bad tensor, a cuda
// rank served with legacy IPC handles) it refuses before any memory is made.
import { readFileSync } from 'node:fs';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { ServeError } from '../../src/errors.js';
import { PublishDesk } from '../../src/serve/publishDesk.js';
import { RankService } from '../../src/serve/rankService.js';
import { PROCESSED_MAX_LAYOUTS } from '../../src/serve/processedLayouts.js';
import { fdTargets } from '../helpers/memfds.js';
import { exampleModel } from '../helpers/paths.js';
import { loadServedRank } from './servedRankFixture.js';

const log = pino({ level: 'silent' });
const caller = { pid: process.pid, connectionId: 1 };
const KEY = 'a'.repeat(32);
const FIELDS = { protocol: 'processed-1', engine: 'test' };
const processedFds = () => fdTargets('self').filter((t) => t.startsWith('/memfd:weightd:processed:'));

async function refusal(p: Promise<unknown>): Promise<ServeError> {
  return p.then(() => assert.unreachable('it was not refused') as never, (e: ServeError) => e);
}

test('publish, commit, serve beside the rank, and go with its release; refusals make no memory', async () => {
  const loaded = await loadServedRank(exampleModel, { uuid: `publish-${process.pid}` });
  const service = new RankService({ rank: loaded.served, log, freeMemory: () => loaded.device.free() });
  const desk = new PublishDesk();
  const tensors = [
    { name: 'a.weight', dtype: 'BF16', shape: [3, 5] },
    { name: 'a.scale', dtype: 'F32', shape: [1] },
  ];
  const begun = await desk.begin(service, { key: KEY, keyFields: FIELDS, tensors }, caller, () => true);
  begun.sent();
  assert.equal(begun.tensors.map((t) => [t.name, t.offset, t.bytes]), [['a.weight', 0, 30], ['a.scale', 256, 4]], 'each tensor at a multiple of 256 bytes');
  assert.ok(desk.holds(caller.connectionId));
  assert.equal(readFileSync(`/proc/self/fd/${begun.fd}`), Buffer.alloc(begun.bytes), 'fresh memory is zero');

  const again = await refusal(desk.begin(service, { key: KEY, keyFields: FIELDS, tensors }, { pid: process.pid, connectionId: 2 }, () => true));
  assert.is(again.code, 'E_PUBLISHED');
  assert.match(again.message, /being published by another engine/);

  const { layout } = await desk.commit(begun.id, caller);
  assert.is(service.processed.get(KEY), layout);
  assert.is(layout.digests.length, 2);
  assert.not.ok(desk.holds(caller.connectionId));
  assert.is(processedFds().length, 1, 'the layout holds one read-only descriptor; the writable one is closed');
  const published = await refusal(desk.begin(service, { key: KEY, keyFields: FIELDS, tensors }, caller, () => true));
  assert.is(published.code, 'E_PUBLISHED');
  assert.match(published.message, /published already: map it/);

  for (const [bad, why] of [
    [[tensors[0], tensors[0]], /names tensor "a.weight" twice/],
    [[{ name: 'x', dtype: 'F7', shape: [2] }], /dtype "F7", which is not a safetensors dtype/],
    [[{ name: 'x', dtype: 'F32', shape: [0] }], /is empty or ends inside a byte/],
    [[{ name: 'x', dtype: 'F32', shape: [2 ** 40, 2 ** 40, 2 ** 40] }], /tensor "x" \(F32 \[1099511627776, 1099511627776, 1099511627776\]\) is 5316911983139663491615228241121378304 bytes, which no memory holds/],
    [[{ name: 'x', dtype: 'U8', shape: [2 ** 40, 2 ** 13 - 1] }, { name: 'y', dtype: 'U8', shape: [2 ** 40] }], /tensor "y" \(U8 \[1099511627776\]\) is 1099511627776 bytes, which no memory holds \(the tensors up to it must stay under 2\^53 bytes\)/],
  ] as [{ name: string; dtype: string; shape: number[] }[], RegExp][]) {
    const err = await refusal(desk.begin(service, { key: 'b'.repeat(32), keyFields: FIELDS, tensors: [...bad] }, caller, () => true));
    assert.is(err.code, 'E_BAD_REQUEST');
    assert.match(err.message, why);
  }
  const capped = await refusal(new PublishDesk(0).begin(service, { key: 'c'.repeat(32), keyFields: FIELDS, tensors }, caller, () => true));
  assert.is(capped.code, 'E_OUT_OF_MEMORY');
  assert.match(capped.message, /past its cap of 0 \(--processed-max-percent 0 of its \d+ bytes\)/);
  const cuda = new RankService({ rank: { ...loaded.served, backend: 'cuda' }, log, freeMemory: async () => {} });
  const unsupported = await refusal(desk.begin(cuda, { key: 'd'.repeat(32), keyFields: FIELDS, tensors }, caller, () => true));
  assert.is(unsupported.code, 'E_UPDATE_UNSUPPORTED');
  assert.match(unsupported.message, /legacy CUDA IPC handles .*restart the daemon with --cuda-handles fd/);
  assert.is(processedFds().length, 1, 'no refusal made memory');

  await service.release();
  assert.is(processedFds().length, 0, 'the layout goes with its rank');
  assert.is(service.processed.get(KEY), undefined);
});

test('a publish whose connection ends before commit leaves nothing; its commit is then refused', async () => {
  const loaded = await loadServedRank(exampleModel, { uuid: `publish2-${process.pid}` });
  const service = new RankService({ rank: loaded.served, log, freeMemory: () => loaded.device.free() });
  const desk = new PublishDesk();
  const begun = await desk.begin(service, { key: KEY, keyFields: FIELDS, tensors: [{ name: 'w', dtype: 'F32', shape: [8] }] }, caller, () => true);
  begun.sent();
  assert.is(processedFds().length, 1);
  desk.connectionClosed(caller.connectionId);
  await Promise.resolve();
  assert.is(processedFds().length, 0);
  const err = await refusal(desk.commit(begun.id, caller));
  assert.is(err.code, 'E_NO_PUBLISH');
  assert.is(service.processed.get(KEY), undefined);
  await service.release();
});

test('a rank keeps at most PROCESSED_MAX_LAYOUTS layouts, published or being published: one more is refused by name and makes no memory; a dropped one frees its place, a mapped one is not dropped', async () => {
  const loaded = await loadServedRank(exampleModel, { uuid: `publish3-${process.pid}` });
  const service = new RankService({ rank: loaded.served, log, freeMemory: () => loaded.device.free() });
  const desk = new PublishDesk();
  const tensors = [{ name: 'w', dtype: 'U8', shape: [1] }];
  const key = (n: number) => n.toString(16).padStart(32, '0');
  for (let n = 0; n < PROCESSED_MAX_LAYOUTS - 1; n++) {
    const begun = await desk.begin(service, { key: key(n), keyFields: FIELDS, tensors }, caller, () => true);
    begun.sent();
    await desk.commit(begun.id, caller);
  }
  const open = await desk.begin(service, { key: key(100), keyFields: FIELDS, tensors }, caller, () => true);
  open.sent();
  assert.is(processedFds().length, PROCESSED_MAX_LAYOUTS);
  const err = await refusal(desk.begin(service, { key: key(101), keyFields: FIELDS, tensors }, caller, () => true));
  assert.is(err.code, 'E_TOO_MANY_PUBLISHED');
  assert.match(err.message, new RegExp(`holds ${PROCESSED_MAX_LAYOUTS} processed layouts published or being published, the most one rank keeps`));
  assert.equal(err.details, { model: loaded.served.name, key: key(101), layouts: PROCESSED_MAX_LAYOUTS, max: PROCESSED_MAX_LAYOUTS });
  assert.is(processedFds().length, PROCESSED_MAX_LAYOUTS, 'the refusal made no memory');

  // A layout that goes (dropped to make room) makes room for one more; one an engine maps is not dropped.
  desk.connectionClosed(caller.connectionId);
  const lease = service.leases.grant(caller, 'map', key(1));
  assert.not.ok(await service.dropProcessed(key(1)), 'a mapped layout stays: closing it would free nothing');
  assert.ok(service.processed.get(key(1)));
  service.leases.detach(caller, lease.id);
  assert.ok(await service.dropProcessed(key(0)));
  const again = await desk.begin(service, { key: key(101), keyFields: FIELDS, tensors }, caller, () => true);
  again.sent();
  await desk.commit(again.id, caller);
  assert.is(service.processed.size, PROCESSED_MAX_LAYOUTS - 1);
  await service.release();
  assert.is(processedFds().length, 0);
});

test.run();
