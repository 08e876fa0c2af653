// The liveness vectors (test/vectors/liveness.json, docs/spec/liveness.md) made concrete for one
// run: each alive vector's pid and start time, for a child that was reaped, one left a zombie,
// this process and init. Every side that implements the rule (the TypeScript client, the
// keeper's C++) is held to the same cases.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as assert from 'uvu/assert';
import { processIdentity } from '../../src/wire/processLiveness.js';
import { repoRoot } from './paths.js';
import { spawnUnreaped } from './unreaped.js';

export interface StatVector { line: string; state: string | null; startTime: string | null; why: string }
export interface AliveVector { pid: number | 'self' | 'reaped' | 'zombie' | 'init'; startTime: 'self' | 'zombie' | 'wrong' | null; alive: boolean; why: string }
/** One alive vector with the pid and start time (undefined: none given) it names in this run. */
export interface AliveCase { vector: AliveVector; pid: number; startTime?: string }

export function livenessVectors(): { stat: StatVector[]; alive: AliveVector[] } {
  return JSON.parse(readFileSync(join(repoRoot, 'test/vectors/liveness.json'), 'utf8')) as { stat: StatVector[]; alive: AliveVector[] };
}

/** Calls `check` with every alive vector's case while its zombie exists, then reaps it. */
export async function withAliveCases(check: (cases: AliveCase[]) => void | Promise<void>): Promise<void> {
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
    await check(
      livenessVectors().alive.map((vector) => ({
        vector,
        pid: typeof vector.pid === 'number' ? vector.pid : pids[vector.pid],
        ...(vector.startTime === null ? {} : { startTime: starts[vector.startTime] }),
      })),
    );
  } finally {
    await zombie.release();
  }
}
