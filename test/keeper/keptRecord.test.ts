// A kept record is adopted only by a rank that would load exactly that arena: every field the
// check compares is refused by name when it differs, and so are records that are not JSON, of a
// format this weightd does not read, or malformed.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { RankPlan } from '../../src/checkpoint/types.js';
import type { FileIdentity } from '../../src/files/fileIdentity.js';
import { arenaDigest, checkKeptRecord, encodeKeptRecord, keptPlanIn, keptRecordFor, parseKeptRecord, type KeptExpectation } from '../../src/keeper/keptRecord.js';

const plan = {
  tpRank: 0,
  tpSize: 2,
  files: ['/models/a/model-1.safetensors', '/models/a/model-2.safetensors'],
  segments: [4 << 20, 2 << 20],
  ops: [{ file: 1, segment: 0, srcOffset: 80, dstOffset: 0, rows: 4, rowBytes: 64, srcPitch: 128 }],
  zeroRanges: [{ segment: 1, offset: 0, bytes: 4096 }],
  totalBytes: 256,
  fingerprint: 'f'.repeat(64),
  contentTensors: { names: ['a', 'b'], ranges: [] },
} as unknown as RankPlan;
const identity = (path: string, ino: string): FileIdentity => ({ path, dev: '2049', ino, size: 1 << 20, mtimeNs: '1733300000123456789', ctimeNs: '1733300000123456789' });
const files = [identity('/models/a/model-1.safetensors', '123'), identity('/models/a/model-2.safetensors', '124')];
const e: KeptExpectation = { backend: 'host', handleType: 'memfd', device: 'host-0', plan, files };
const good = keptRecordFor(e, '/models/a', 'weightd 0.1.0');

test('a record carries the fill\'s digests, and one with a digest per tensor of another checkpoint is refused naming digests', () => {
  const digests = ['0'.repeat(32), '1'.repeat(32)];
  const kept = checkKeptRecord(encodeKeptRecord(keptRecordFor(e, '/models/a', 'weightd 0.1.0', undefined, digests)), e);
  assert.ok('record' in kept && kept.record.digests !== undefined, JSON.stringify(kept));
  if ('record' in kept) assert.equal(kept.record.digests, digests);
  const short = checkKeptRecord(encodeKeptRecord(keptRecordFor(e, '/models/a', 'weightd 0.1.0', undefined, digests.slice(1))), e);
  assert.ok('refusal' in short && short.refusal.field === 'digests', JSON.stringify(short));
});

test('a start parses each record once: the plan lookup, the restore and the TAKE of the same bytes (another buffer) share one parse', () => {
  const listed = encodeKeptRecord(keptRecordFor(e, '/models/a', 'weightd 0.1.0', undefined, ['0'.repeat(32), '1'.repeat(32)]));
  const first = parseKeptRecord(listed);
  assert.ok('record' in first);
  assert.equal(keptPlanIn(listed), {}, 'a record without a plan');
  const taken = Buffer.from(listed);
  const checked = checkKeptRecord(taken, e);
  assert.ok('record' in checked && checked.record === first.record, 'the TAKE\'s bytes were not parsed again');
  assert.is(parseKeptRecord(listed), first);
  const other = Buffer.from(listed);
  other[other.indexOf('host-0')] = 'H'.charCodeAt(0);
  const another = parseKeptRecord(other);
  assert.ok('record' in another && another.record.device === 'Host-0', 'bytes of the same length that differ are parsed as themselves');
});

test('a record adopts into the rank it was written for, also from another directory', () => {
  const r = checkKeptRecord(encodeKeptRecord(good), e);
  assert.ok('record' in r, JSON.stringify(r));
  const moved = { ...plan, files: plan.files.map((f) => f.replace('/models/a', '/srv/other')) } as RankPlan;
  assert.is(arenaDigest(moved), arenaDigest(plan), 'file names, not paths');
  const movedFiles = files.map((f) => ({ ...f, path: f.path.replace('/models/a', '/srv/other') }));
  assert.ok('record' in checkKeptRecord(encodeKeptRecord(good), { ...e, plan: moved, files: movedFiles }), 'a directory moved within its file system keeps its files\' identity');
});

test('a checkpoint file replaced, resized, modified or written since the shard was kept is refused, naming the file and how', () => {
  const cases: Array<[Partial<FileIdentity>, RegExp]> = [
    [{ ino: '456' }, /model-2\.safetensors: inode 124 -> 456 \(replaced\)/],
    [{ dev: '2050' }, /model-2\.safetensors: device 2049 -> 2050 \(replaced\)/],
    [{ size: 1 }, /model-2\.safetensors: size 1048576 -> 1 \(resized\)/],
    [{ mtimeNs: '1733300000123456790' }, /model-2\.safetensors: mtime 1733300000123456789 -> 1733300000123456790 \(modified\)/],
    // A write whose mtime was put back (touch -d): only ctime, which no user can set, shows it.
    [{ ctimeNs: '1733300000987654321' }, /model-2\.safetensors: ctime 1733300000123456789 -> 1733300000987654321 \(written\)/],
  ];
  for (const [change, named] of cases) {
    const r = checkKeptRecord(encodeKeptRecord(good), { ...e, files: [files[0]!, { ...files[1]!, ...change }] });
    assert.ok('refusal' in r, JSON.stringify(change));
    if ('refusal' in r) {
      assert.is(r.refusal.field, 'files');
      assert.match(r.refusal.message, /^the checkpoint files changed since the shard was kept \(/);
      assert.match(r.refusal.message, named);
      assert.is(r.refusal.changes?.length, 1);
    }
  }
});

test("a record without file identities (an older daemon's) is refused: its bytes cannot be shown to be the files'", () => {
  const { files: _, ...older } = good;
  const r = checkKeptRecord(Buffer.from(JSON.stringify({ ...older, writer: 'weightd 0.0.9' })), e);
  assert.ok('refusal' in r);
  if ('refusal' in r) {
    assert.is(r.refusal.field, 'files');
    assert.match(r.refusal.message, /carries no identity of the checkpoint files \(written by weightd 0\.0\.9, older than that check\)/);
  }
});

test('a record that names fewer checkpoint files than the plan reads (none, or one of two) is refused: the others would go unchecked', () => {
  for (const named of [[], [files[0]!]]) {
    const r = checkKeptRecord(encodeKeptRecord({ ...good, files: named }), e);
    assert.ok('refusal' in r, JSON.stringify(named));
    if ('refusal' in r) {
      assert.is(r.refusal.field, 'files');
      assert.match(r.refusal.message, new RegExp(`the kept record names ${named.length} checkpoint file\\(s\\), and this rank's plan reads 2`));
    }
  }
});

test('each field that differs is refused by name', () => {
  const cases: Array<[string, KeptExpectation]> = [
    ['backend', { ...e, backend: 'cuda' }],
    ['handleType', { ...e, handleType: 'cuda-fd' }],
    ['device', { ...e, device: 'host-1' }],
    ['fingerprint', { ...e, plan: { ...plan, fingerprint: 'e'.repeat(64) } }],
    ['arena', { ...e, plan: { ...plan, ops: [{ ...plan.ops[0]!, dstOffset: 64 }] } }],
    ['arena', { ...e, plan: { ...plan, zeroRanges: [] } }],
    ['arena', { ...e, plan: { ...plan, segments: [4 << 20, 4 << 20] } }],
    ['totalBytes', { ...e, plan: { ...plan, totalBytes: 512 } }],
  ];
  for (const [field, other] of cases) {
    const r = checkKeptRecord(encodeKeptRecord(good), other);
    assert.ok('refusal' in r, field);
    if ('refusal' in r) {
      assert.is(r.refusal.field, field);
      assert.match(r.refusal.message, new RegExp(`the kept record's ${field} is .*, and this rank needs `));
    }
  }
});

test('a record that is not JSON, of another format, or malformed is refused, never thrown', () => {
  const refusal = (bytes: Buffer) => {
    const r = checkKeptRecord(bytes, e);
    assert.ok('refusal' in r);
    return 'refusal' in r ? r.refusal : undefined;
  };
  assert.match(refusal(Buffer.from([0, 1, 2]))!.message, /is not JSON: it is corrupt or not weightd's/);
  assert.match(refusal(Buffer.from('null'))!.message, /format undefined, and this weightd reads formats 1/);
  assert.match(refusal(Buffer.from(JSON.stringify({ ...good, format: 2, writer: 'weightd 0.3.0' })))!.message, /format 2 \(written by weightd 0\.3\.0\), and this weightd reads formats 1/);
  assert.match(refusal(Buffer.from(JSON.stringify({ ...good, segments: 'many' })))!.message, /malformed at segments/);
  assert.match(refusal(Buffer.from(JSON.stringify({ ...good, arena: 'short' })))!.message, /malformed at arena/);
});

test.run();
