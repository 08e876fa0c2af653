// A layout's packed tensors are encoded once per tensor list, not per version: a writer's
// version serves its base's list, and at 50k tensors encoding it again took 23-53 ms a commit.
// Nor are a version's digests by name made at its publication: only a get_state that asks reads them.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { EncodedManifest, type ManifestHead } from '../../src/serve/encodedManifest.js';
import { fromPacked } from '../../src/wire/packedManifest.js';
import type { TensorView } from '../../src/checkpoint/types.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { toServedRankData } from '../../src/serve/servedRankData.js';
import { exampleModel } from '../helpers/paths.js';

const head = (fingerprint: string): ManifestHead => ({
  fingerprint,
  backend: 'host',
  device: { uuid: 'host-0', backend: 'host', index: 0, name: 'host' },
  rank: { globalRank: 0, localRank: 0, nodeRank: 0, nnodes: 1, tpSize: 1 },
  layout: 'checkpoint',
  segments: [{ segment: 0, bytes: 64, handle: 'fd' }],
});
const tensors = (names: string[]): TensorView[] => names.map((name, i) => ({ name, dtype: 'F32', shape: [4], segment: 0, offset: 16 * i, bytes: 16 }));
const fields = (m: EncodedManifest) => JSON.parse(`{${m.encoded('packed').fields.toString('utf8')}`) as Record<string, unknown>;

test("two versions of one layout share its packed tensors, each with its own head; another list is encoded on its own", () => {
  const list = tensors(['a', 'b', 'c']);
  const base = new EncodedManifest(head('f0'), { tensors: list, aliases: {} });
  const written = new EncodedManifest(head('f1'), { tensors: list, aliases: { d: 'a' } });
  assert.ok(base.encoded('packed').trailer === written.encoded('packed').trailer, 'the same list is packed once');
  assert.equal(fields(base).fingerprint, 'f0');
  assert.equal(fields(written).fingerprint, 'f1');
  assert.equal(fields(written).aliases, { d: 'a' });
  assert.equal(fromPacked(written.encoded('packed').trailer!).map((t) => t.name), ['a', 'b', 'c']);
  const other = new EncodedManifest(head('f2'), { tensors: tensors(['a', 'b', 'c']), aliases: {} });
  assert.ok(other.encoded('packed').trailer !== base.encoded('packed').trailer, 'an equal list of another layout is its own');
  assert.equal(other.encoded('packed').trailer, base.encoded('packed').trailer);
});

test('a list the packed form cannot carry is sent as columns by every version of it', () => {
  const list = tensors(['a\u0000b']);
  for (const fp of ['f0', 'f1']) {
    const m = new EncodedManifest(head(fp), { tensors: list, aliases: {} });
    const { fields: bytes, trailer } = m.encoded('packed');
    assert.is(trailer, undefined);
    assert.ok(bytes.toString('utf8').includes('"columns"'), 'columns instead');
  }
});

test("a written version's digests by name are made when first read, and the manifest's content carries them alone", async () => {
  const plan = await planCheckpoint(exampleModel, { tpSize: 1 });
  const rank = plan.ranks[0]!;
  const digests = rank.tensors.map((_, i) => i.toString(16).padStart(32, '0'));
  const device = { backend: 'host' as const, index: 0, uuid: 'host-0', name: 'host', totalBytes: 0, freeBytes: 0 };
  const served = toServedRankData({ name: 'tiny-llama', plan, globalRank: 0, localRank: 0, nodeRank: 0, nnodes: 1, backend: 'host', device, segments: [], digests, written: true });
  const full = served.full!;
  // An accessor until read: a commit that publishes a version builds no object of every name.
  assert.type(Object.getOwnPropertyDescriptor(full, 'digests')?.get, 'function');
  const byName = full.digests;
  assert.equal(Object.keys(byName), rank.tensors.map((t) => t.name));
  assert.equal(Object.values(byName), digests);
  assert.ok(full.digests === byName, 'made once');
  const manifest = new EncodedManifest(head(served.fingerprint), { tensors: served.tensors, aliases: served.aliases }, full);
  const content = JSON.parse(`{${manifest.content()!.toString('utf8').slice(0, -1)}}`) as { content: Record<string, unknown> };
  assert.equal(content.content, { fingerprint: full.fingerprint, digests: byName }, 'its fingerprint fields stay out');
});

test.run();
