// The keeper watches its owners by pidfd; where pidfd_open is missing or refused it polls them
// with its own copy of the liveness rule (native/keeper/process_liveness.cpp), held here to the
// vectors both clients read (docs/spec/liveness.md): a zombie owner or a reused pid is gone, not
// alive, so its records start to expire.
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { processIdentity } from '../../src/wire/processLiveness.js';
import { freshTempDir, repoRoot } from '../helpers/paths.js';
import { spawnUnreaped } from '../helpers/unreaped.js';

interface StatVector { line: string; state: string | null; startTime: string | null; why: string }
interface AliveVector { pid: number | 'self' | 'reaped' | 'zombie' | 'init'; startTime: 'self' | 'zombie' | 'wrong' | null; alive: boolean; why: string }
const vectors = JSON.parse(readFileSync(join(repoRoot, 'test/vectors/liveness.json'), 'utf8')) as { stat: StatVector[]; alive: AliveVector[] };

const dir = freshTempDir();
const program = join(dir, 'liveness-check');
execFileSync('c++', ['-std=c++17', '-O1', '-Wall', '-Wextra', '-Werror', '-I', join(repoRoot, 'native'),
  join(repoRoot, 'test', 'native', 'liveness_check.cpp'), join(repoRoot, 'native', 'keeper', 'process_liveness.cpp'), '-o', program], { stdio: 'inherit' });

test('the keeper reads state and start time from /proc/<pid>/stat lines as the vectors say', () => {
  const files = vectors.stat.map((v, i) => {
    const file = join(dir, `stat-${i}`);
    writeFileSync(file, v.line, 'latin1');
    return file;
  });
  const lines = execFileSync(program, ['stat', ...files], { encoding: 'utf8' }).trimEnd().split('\n');
  vectors.stat.forEach((v, i) => assert.is(lines[i], `${v.state ?? '-'} ${v.startTime ?? '-'}`, v.why));
});

test('the keeper counts a process alive or gone as the vectors say: a zombie and a reused pid are gone', async () => {
  const self = processIdentity(process.pid);
  assert.ok(self.startTime, 'this test needs /proc');
  const reaped = spawnSync(process.execPath, ['-e', 'console.log(process.pid)'], { encoding: 'utf8' });
  const zombie = await spawnUnreaped([process.execPath, '-e', '']);
  try {
    await zombie.zombie;
    const zombieStart = processIdentity(zombie.pid).startTime;
    assert.ok(zombieStart, 'a zombie still has its /proc/<pid>/stat');
    const pids = { self: process.pid, reaped: Number(reaped.stdout.trim()), zombie: zombie.pid, init: 1 };
    const starts = { self: self.startTime, zombie: zombieStart, wrong: `${self.startTime}1` };
    const args = vectors.alive.flatMap((v) => [String(typeof v.pid === 'number' ? v.pid : pids[v.pid]), v.startTime === null ? '-' : starts[v.startTime]!]);
    // The program is a child of this process: `self` is its parent, alive all along.
    const lines = execFileSync(program, ['alive', ...args], { encoding: 'utf8' }).trimEnd().split('\n');
    vectors.alive.forEach((v, i) => assert.is(lines[i], v.alive ? '1' : '0', `${JSON.stringify(v)}: ${v.why}`));
  } finally {
    await zombie.release();
  }
});

test.run();
