// The xxh3-128 that the fill's GPU digest kernel runs (native/xxh3_core.h) is the same source on
// the CPU: test/native/xxh3_core_check.cpp compiles it with the C++ compiler that builds the addon
// and compares it, the warp's decomposition of long inputs included, with the xxHash library for
// every length to 2.2 KiB and around the block and piece sizes. The GPU run of the kernel itself
// is test/gpu (gpu-check.mjs, "GPU digests").
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freshTempDir, repoRoot } from '../helpers/paths.js';

test('xxh3_core.h hashes as the xxHash library does, short inputs and a warp\'s long ones, aligned and not', () => {
  const program = join(freshTempDir(), 'xxh3-core-check');
  execFileSync('c++', ['-std=c++17', '-O1', '-Wall', '-Wextra', '-Werror', '-I', join(repoRoot, 'native'),
    join(repoRoot, 'test', 'native', 'xxh3_core_check.cpp'), '-o', program], { stdio: 'inherit' });
  let out: string;
  try {
    out = execFileSync(program, { encoding: 'utf8' });
  } catch (err) {
    assert.unreachable(`xxh3_core_check failed:\n${(err as { stdout?: string }).stdout ?? err}`);
    return;
  }
  assert.match(out, /^6795 checked, 0 mismatched$/m);
});

test.run();
