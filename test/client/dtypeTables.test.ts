// The dtype tables (docs/spec/dtypes.md) against test/vectors/dtypes.json, which the Python
// client's tests read too: the safetensors names the daemon and the client accept, their widths,
// the typed array the client views each through, and the names both refuse.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { bytesForElements, dtypeBits, DTYPES, isDtype, type SafetensorsDtype } from '../../src/checkpoint/dtypes.js';
import { tensorArray } from '../../src/client/tensorViews.js';
import { ProtocolError } from '../../src/errors.js';
import { repoRoot } from '../helpers/paths.js';

interface DtypeVectors {
  dtypes: Array<{ name: string; bits: number; typedArray: string }>;
  refused: Array<{ name: string; why: string }>;
  bytesForElements: Array<{ dtype: SafetensorsDtype; elements: number; bytes: number | null }>;
}

const vectors = JSON.parse(readFileSync(join(repoRoot, 'test/vectors/dtypes.json'), 'utf8')) as DtypeVectors;

const viewOf = (dtype: string) => tensorArray({ name: 't', dtype, shape: [1], segment: 0, offset: 0, bytes: 8 }, new ArrayBuffer(8));

test('the dtypes are exactly the vectors\', each of its width', () => {
  assert.equal([...DTYPES].sort(), vectors.dtypes.map((d) => d.name).sort());
  for (const d of vectors.dtypes) {
    assert.ok(isDtype(d.name), d.name);
    assert.is(dtypeBits(d.name as SafetensorsDtype), d.bits, d.name);
  }
});

test('the client views each dtype through the vectors\' typed array', () => {
  for (const d of vectors.dtypes) assert.is(viewOf(d.name).constructor.name, d.typedArray, d.name);
});

test('a name the vectors refuse is no dtype, and the client refuses to view it (E_UNKNOWN_DTYPE)', () => {
  for (const { name, why } of vectors.refused) {
    assert.not.ok(isDtype(name), `${JSON.stringify(name)}: ${why}`);
    try {
      viewOf(name);
      assert.unreachable(`${JSON.stringify(name)} was viewed: ${why}`);
    } catch (err) {
      assert.instance(err, ProtocolError, `${JSON.stringify(name)}: ${String(err)}`);
      assert.is((err as ProtocolError).code, 'E_UNKNOWN_DTYPE');
      assert.ok((err as Error).message.includes(JSON.stringify(name)), (err as Error).message);
    }
  }
});

test('the bytes of n elements, null where they end mid-byte', () => {
  for (const v of vectors.bytesForElements) assert.is(bytesForElements(v.dtype, v.elements), v.bytes, `${v.elements} x ${v.dtype}`);
});

test.run();
