// Well-formed safetensors headers: what the parser accepts and what it reports about them.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { truncate } from 'node:fs/promises';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { encodeSafetensorsHeader, writeSafetensors } from '../../src/checkpoint/writeSafetensors.js';
import { makeTempDir, randomBytes, removeDir, writeRawSafetensors } from '../helpers/checkpoints.js';

let dir = '';
test.before(() => { dir = makeTempDir('parse'); });
test.after(() => removeDir(dir));

test('a written file reads back: names, dtypes, shapes, absolute offsets, metadata', async () => {
  const path = join(dir, 'rt.safetensors');
  await writeSafetensors(path, [
    { name: 'a', dtype: 'BF16', shape: [3, 5], data: randomBytes(1, 30) },
    { name: 'b', dtype: 'F32', shape: [], data: randomBytes(2, 4) },
    { name: 'c', dtype: 'F4', shape: [2, 3], data: randomBytes(3, 3) },
    { name: 'empty', dtype: 'I64', shape: [0, 7] },
  ], { format: 'pt' });
  const h = await parseSafetensors(path);
  const file = readFileSync(path);
  assert.is(h.fileSize, file.length);
  assert.is(h.dataStart % 8, 0, 'the writer pads the header to 8 bytes');
  assert.equal(h.metadata, { format: 'pt' });
  assert.equal(h.tensors.map((t) => [t.name, t.dtype, t.shape, t.begin - h.dataStart, t.end - h.dataStart]), [
    ['a', 'BF16', [3, 5], 0, 30], ['b', 'F32', [], 30, 34], ['c', 'F4', [2, 3], 34, 37], ['empty', 'I64', [0, 7], 37, 37],
  ]);
  assert.ok(file.subarray(h.tensors[0]!.begin, h.tensors[0]!.end).equals(Buffer.from(randomBytes(1, 30))));
  assert.is(h.headerSha256, createHash('sha256').update(file.subarray(0, h.dataStart)).digest('hex'));
});

test('entries are returned in data order whatever their order in the header', async () => {
  const path = join(dir, 'order.safetensors');
  await writeRawSafetensors(path, '{"z":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[3],"data_offsets":[2,5]}}', 5);
  assert.equal((await parseSafetensors(path)).tensors.map((t) => t.name), ['z', 'a']);
});

test('accepts what the reference crate accepts: empty header, whitespace, null metadata, extra entry fields', async () => {
  const cases = ['{}', '  {}  ', '\t\n{}\r ', '{"__metadata__":null}', '{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":true}}'];
  for (const [i, header] of cases.entries()) {
    const path = join(dir, `ok-${i}.safetensors`);
    await writeRawSafetensors(path, header, header.includes('"w"') ? 1 : 0);
    const h = await parseSafetensors(path);
    assert.is(h.metadata, null);
  }
});

test('keys with escapes and braces inside strings are not mistaken for duplicates', async () => {
  const path = join(dir, 'escapes.safetensors');
  const header = JSON.stringify({
    __metadata__: { 'a"}{': 'x\\"', b: '{"w":1,"w":2}' },
    'w\\': { dtype: 'U8', shape: [1], data_offsets: [0, 1] },
    'w"': { dtype: 'U8', shape: [1], data_offsets: [1, 2] },
    w: { dtype: 'U8', shape: [1], data_offsets: [2, 3] },
  });
  await writeRawSafetensors(path, header, 3);
  assert.equal((await parseSafetensors(path)).tensors.map((t) => t.name), ['w\\', 'w"', 'w']);
});

test('only the header is read: a 64 GiB sparse file parses at once', async () => {
  const path = join(dir, 'huge.safetensors');
  const shape = [2 ** 36];
  const { header } = encodeSafetensorsHeader([{ name: 'big', dtype: 'U8', shape }]);
  await writeRawSafetensors(path, header.subarray(8));
  await truncate(path, header.length + 2 ** 36);
  const started = performance.now();
  const h = await parseSafetensors(path);
  assert.ok(performance.now() - started < 1000);
  assert.is(h.tensors[0]!.end, h.fileSize);
});

test('the writer refuses data of the wrong size and reserved or repeated names', async () => {
  assert.throws(() => encodeSafetensorsHeader([{ name: 'a', dtype: 'F32', shape: [2], data: new Uint8Array(7) }]), /needs 8 bytes/);
  assert.throws(() => encodeSafetensorsHeader([{ name: '__metadata__', dtype: 'U8', shape: [1] }]), /reserved/);
  assert.throws(() => encodeSafetensorsHeader([{ name: 'a', dtype: 'U8', shape: [1] }, { name: 'a', dtype: 'U8', shape: [1] }]), /already used/);
  assert.throws(() => encodeSafetensorsHeader([{ name: 'a', dtype: 'F4', shape: [3] }]), /whole bytes/);
});

test.run();
