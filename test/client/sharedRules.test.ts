// The rules both clients implement, checked against the vectors the Python tests read too
// (test/vectors, specified in docs/spec): socket file names, process liveness and manifest columns.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { isProcessAlive, processIdentity, startTimeFromStat, stateFromStat } from '../../src/wire/processLiveness.js';
import { deviceFileStem } from '../../src/wire/socketDir.js';
import { fromColumns, toColumns } from '../../src/wire/tensorColumns.js';
import { TensorColumns, type TensorMeta } from '../../src/wire/protocol.js';
import { repoRoot } from '../helpers/paths.js';
import { spawnUnreaped } from '../helpers/unreaped.js';

function vectors<T>(name: string): T {
  return JSON.parse(readFileSync(join(repoRoot, 'test/vectors', name), 'utf8')) as T;
}

interface NameVector { id: string; stem: string; why: string }
interface StatVector { line: string; state: string | null; startTime: string | null; why: string }
interface AliveVector { pid: number | 'self' | 'reaped' | 'zombie' | 'init'; startTime: 'self' | 'zombie' | 'wrong' | null; alive: boolean; why: string }

test('socket names: every vector', () => {
  const { vectors: cases } = vectors<{ vectors: NameVector[] }>('socket-names.json');
  for (const v of cases) assert.is(deviceFileStem(v.id), v.stem, `${JSON.stringify(v.id)}: ${v.why}`);
});

test('liveness: states and start times read from /proc/<pid>/stat lines', () => {
  const { stat } = vectors<{ stat: StatVector[] }>('liveness.json');
  for (const v of stat) {
    assert.is(stateFromStat(v.line) ?? null, v.state, v.why);
    assert.is(startTimeFromStat(v.line) ?? null, v.startTime, v.why);
  }
});

test('liveness: alive or not, for each kind of process', async () => {
  const { alive } = vectors<{ alive: AliveVector[] }>('liveness.json');
  const self = processIdentity(process.pid);
  assert.ok(self.startTime, 'this test needs /proc');
  // A child that has exited and been waited for: its pid names no process now.
  const reaped = spawnSync(process.execPath, ['-e', 'console.log(process.pid)'], { encoding: 'utf8' });
  // One that has exited and that nobody has waited for: a zombie until released.
  const zombie = await spawnUnreaped([process.execPath, '-e', '']);
  try {
    await zombie.zombie;
    const zombieStart = processIdentity(zombie.pid).startTime;
    assert.ok(zombieStart, 'a zombie still has its /proc/<pid>/stat');
    const pids = { self: process.pid, reaped: Number(reaped.stdout.trim()), zombie: zombie.pid, init: 1 };
    const starts = { self: self.startTime, zombie: zombieStart, wrong: `${self.startTime}1` };
    for (const v of alive) {
      const pid = typeof v.pid === 'number' ? v.pid : pids[v.pid];
      const id = v.startTime === null ? { pid } : { pid, startTime: starts[v.startTime] };
      assert.is(isProcessAlive(id), v.alive, `${JSON.stringify(v)}: ${v.why}`);
    }
  } finally {
    await zombie.release();
  }
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

test.run();
