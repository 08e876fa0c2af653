// The rules both clients implement, checked against the vectors the Python tests read too
// (test/vectors, specified in docs/spec): socket file names, process liveness, manifest columns and the packed manifest.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { isRankSocketName } from '../../src/client/findSocket.js';
import { isProcessAlive, startTimeFromStat, stateFromStat } from '../../src/wire/processLiveness.js';
import { deviceFileStem } from '../../src/wire/socketDir.js';
import { fromColumns, toColumns } from '../../src/wire/tensorColumns.js';
import { fromPacked, toPacked } from '../../src/wire/packedManifest.js';
import { TensorColumns, type TensorMeta } from '../../src/wire/protocol.js';
import { repoRoot } from '../helpers/paths.js';
import { livenessVectors, withAliveCases } from '../helpers/livenessCases.js';

function vectors<T>(name: string): T {
  return JSON.parse(readFileSync(join(repoRoot, 'test/vectors', name), 'utf8')) as T;
}

interface NameVector { id: string; stem: string; why: string }

test('socket names: every vector', () => {
  const { vectors: cases } = vectors<{ vectors: NameVector[] }>('socket-names.json');
  for (const v of cases) assert.is(deviceFileStem(v.id), v.stem, `${JSON.stringify(v.id)}: ${v.why}`);
});

test('socket names: which sockets in the directory may serve a rank', () => {
  const { sockets } = vectors<{ sockets: Array<{ name: string; rank: boolean; why: string }> }>('socket-names.json');
  for (const v of sockets) assert.is(isRankSocketName(v.name), v.rank, `${v.name}: ${v.why}`);
});

test('liveness: states and start times read from /proc/<pid>/stat lines', () => {
  const { stat } = livenessVectors();
  for (const v of stat) {
    assert.is(stateFromStat(v.line) ?? null, v.state, v.why);
    assert.is(startTimeFromStat(v.line) ?? null, v.startTime, v.why);
  }
});

test('liveness: alive or not, for each kind of process', async () => {
  await withAliveCases((cases) => {
    for (const { vector: v, pid, startTime } of cases) {
      assert.is(isProcessAlive(startTime === undefined ? { pid } : { pid, startTime }), v.alive, `${JSON.stringify(v)}: ${v.why}`);
    }
  });
});

interface ColumnsVector { why: string; tensors: TensorMeta[]; columns: TensorColumns }
interface BadColumnsVector { why: string; columns: unknown; mentions: string | null }

test('manifest columns: the daemon writes each vector\'s columns, and the client reads its tensors back', () => {
  const { valid } = vectors<{ valid: ColumnsVector[] }>('manifest-columns.json');
  for (const v of valid) {
    assert.equal(toColumns(v.tensors), v.columns, v.why);
    assert.equal(fromColumns(TensorColumns.parse(v.columns)), v.tensors, v.why);
  }
});

test('manifest columns: the client refuses each bad vector, naming what is wrong', () => {
  const { invalid } = vectors<{ invalid: BadColumnsVector[] }>('manifest-columns.json');
  for (const v of invalid) {
    const parsed = TensorColumns.safeParse(v.columns);
    if (!parsed.success) {
      // The wrong JSON types: off the reply's schema, which the client refuses as E_BAD_REPLY.
      assert.is(v.mentions, null, `${v.why}: the schema refused columns whose message the vector names`);
      continue;
    }
    try {
      fromColumns(parsed.data);
      assert.unreachable(v.why);
    } catch (err) {
      assert.is((err as { code?: string }).code, 'E_BAD_MANIFEST', v.why);
      if (v.mentions !== null) assert.ok((err as Error).message.includes(v.mentions), `${v.why}: ${(err as Error).message}`);
    }
  }
});

interface PackedVector { why: string; tensors: TensorMeta[]; packed: string }
interface BadPackedVector { why: string; packed: string; at: number; mentions: string }

test('packed manifest: the daemon writes each vector\'s bytes, and the client reads its tensors back', () => {
  const { valid } = vectors<{ valid: PackedVector[] }>('manifest-packed.json');
  for (const v of valid) {
    assert.is(toPacked(v.tensors)?.toString('hex'), v.packed, v.why);
    assert.equal(fromPacked(Buffer.from(v.packed, 'hex')), v.tensors, v.why);
  }
});

test('packed manifest: the client refuses each bad vector, naming the byte and the problem', () => {
  const { invalid } = vectors<{ invalid: BadPackedVector[] }>('manifest-packed.json');
  for (const v of invalid) {
    try {
      fromPacked(Buffer.from(v.packed, 'hex'));
      assert.unreachable(v.why);
    } catch (err) {
      assert.is((err as { code?: string }).code, 'E_BAD_MANIFEST', v.why);
      const message = (err as Error).message;
      assert.ok(message.includes(`at byte ${v.at}: `) && message.includes(v.mentions), `${v.why}: ${message}`);
    }
  }
});

test('packed manifest: a name holding U+0000 cannot be packed, so the daemon sends columns', () => {
  assert.is(toPacked([{ name: 'a\u0000b', dtype: 'F32', shape: [1], segment: 0, offset: 0, bytes: 4 }]), undefined);
});

test.run();
