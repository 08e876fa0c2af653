// The keeper watches its owners by pidfd; where pidfd_open is missing or refused it polls them
// with its own copy of the liveness rule (native/keeper/process_liveness.cpp), held here to the
// vectors both clients read (docs/spec/liveness.md): a zombie owner or a reused pid is gone, not
// alive, so its records start to expire.
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { livenessVectors, withAliveCases } from '../helpers/livenessCases.js';
import { freshTempDir, repoRoot } from '../helpers/paths.js';

const vectors = livenessVectors();
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
  await withAliveCases((cases) => {
    const args = cases.flatMap((c) => [String(c.pid), c.startTime ?? '-']);
    // The program is a child of this process: `self` is its parent, alive all along.
    const lines = execFileSync(program, ['alive', ...args], { encoding: 'utf8' }).trimEnd().split('\n');
    cases.forEach((c, i) => assert.is(lines[i], c.vector.alive ? '1' : '0', `${JSON.stringify(c.vector)}: ${c.vector.why}`));
  });
});

test.run();
