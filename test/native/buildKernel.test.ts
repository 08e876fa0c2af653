// The digest kernel's build (native/gpu/build-kernel.sh), with stand-ins for nvcc: a generation
// the nvcc lacks is left out with a warning; where it cannot build the kernel at all, the build's
// way (--optional, as CMakeLists.txt runs it) warns, leaves no kernel, not even an older one, and
// exits 0 so the addon still builds, while a person running the script is told it failed.
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freshTempDir, repoRoot } from '../helpers/paths.js';

const script = join(repoRoot, 'native/gpu/build-kernel.sh');

/** An nvcc that lists `archs` (--list-gpu-arch), records its arguments, and builds (writes -o) unless `fails`. */
function fakeNvcc(dir: string, archs: number[], fails = false): { nvcc: string; calls: () => string[] } {
  const nvcc = join(dir, 'nvcc');
  const log = join(dir, 'calls');
  writeFileSync(log, '');
  writeFileSync(
    nvcc,
    `#!/bin/sh
if [ "$1" = --list-gpu-arch ]; then printf '%s\\n' ${archs.map((a) => `compute_${a}`).join(' ')}; exit 0; fi
echo "$*" >> ${log}
${fails ? 'echo "nvcc fatal   : Unsupported gpu architecture" >&2; exit 1' : 'while [ $# -gt 1 ]; do [ "$1" = -o ] && echo kernel > "$2"; shift; done'}
`,
  );
  chmodSync(nvcc, 0o755);
  return { nvcc, calls: () => readFileSync(log, 'utf8').trim().split('\n').filter(Boolean) };
}

const run = (args: string[]) => spawnSync('bash', [script, ...args], { encoding: 'utf8' });

test('generations the nvcc lacks are left out, with a warning, and the rest built', () => {
  const dir = freshTempDir();
  const { nvcc, calls } = fakeNvcc(dir, [75, 80, 86]);
  const out = join(dir, 'weightd-digests.fatbin');
  const r = run(['--optional', nvcc, out, '75;80;86;89;90']);
  assert.is(r.status, 0, r.stderr);
  assert.match(r.stderr, `${nvcc} cannot build sm_89`);
  assert.match(r.stderr, `${nvcc} cannot build sm_90`);
  assert.is(calls().length, 1);
  assert.match(calls()[0]!, 'arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_86,code=sm_86 -gencode arch=compute_86,code=compute_86 ');
  assert.not.match(calls()[0]!, 'sm_89');
  assert.ok(existsSync(out));
});

test('an nvcc that fails: --optional warns, leaves no kernel and exits 0; run by hand it fails', () => {
  const dir = freshTempDir();
  const { nvcc } = fakeNvcc(dir, [75, 80, 86, 89, 90], true);
  const out = join(dir, 'weightd-digests.fatbin');
  writeFileSync(out, 'an older kernel');
  const optional = run(['--optional', nvcc, out]);
  assert.is(optional.status, 0, optional.stderr);
  assert.match(optional.stderr, /WARNING: no GPU digest kernel: .*nvcc failed \(exit 1\) .*; the addon is built without it and fills hash their digests on the CPU/);
  assert.not.ok(existsSync(out), 'no kernel of older sources is left to load');
  const strict = run([nvcc, out]);
  assert.is(strict.status, 1);
  assert.match(strict.stderr, /nvcc failed \(exit 1\)/);
});

test('an nvcc that has none of the generations asked builds nothing', () => {
  const dir = freshTempDir();
  const { nvcc, calls } = fakeNvcc(dir, [50, 52]);
  const out = join(dir, 'weightd-digests.fatbin');
  const r = run(['--optional', nvcc, out, '89 90']);
  assert.is(r.status, 0, r.stderr);
  assert.match(r.stderr, /WARNING: no GPU digest kernel: .* can build none of sm 89 90/);
  assert.equal(calls(), []);
  assert.is(run([nvcc, out, '89 90']).status, 1);
});

test.run();
