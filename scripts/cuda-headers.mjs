#!/usr/bin/env node
// The addon compiles against the CUDA driver API's header for its types only (libcuda is
// dlopen'ed at run time). Machines without a CUDA toolkit (CI, a laptop) get the header from
// NVIDIA's pinned runtime wheel on PyPI, unpacked into .cuda-headers (outside build/, which
// cmake-js may wipe), so `npm install` works on a fresh machine with nothing but Node, a
// compiler, cmake and python3 with pip.
import { existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const WHEEL = 'nvidia-cuda-runtime==13.5.37';
const root = fileURLToPath(new URL('..', import.meta.url));
const target = join(root, '.cuda-headers');

const candidates = [process.env.CUDA_HOME && join(process.env.CUDA_HOME, 'include'),
  '/usr/local/cuda/include', '/usr/include', join(target, 'include')].filter(Boolean);
if (candidates.some((dir) => existsSync(join(dir, 'cuda.h')))) process.exit(0);

const download = join(target, 'wheel');
rmSync(target, { recursive: true, force: true });
mkdirSync(download, { recursive: true });
try {
  execFileSync('python3', ['-m', 'pip', 'download', '--quiet', '--no-deps', '--only-binary=:all:',
    '--dest', download, WHEEL], { stdio: 'inherit' });
  const wheel = readdirSync(download).find((f) => f.endsWith('.whl'));
  if (!wheel) throw new Error(`pip downloaded no wheel for ${WHEEL}`);
  // A wheel is a zip; python's zipfile avoids depending on unzip being installed.
  execFileSync('python3', ['-c', `
import sys, zipfile, os
src, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(src) as z:
    for name in z.namelist():
        parts = name.split('/')
        if 'include' in parts[:-1] and name.endswith('.h'):
            rel = '/'.join(parts[parts.index('include') + 1:])
            out = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, 'wb') as f:
                f.write(z.read(name))
`, join(download, wheel), join(target, 'include')], { stdio: 'inherit' });
  rmSync(download, { recursive: true, force: true });
} catch (err) {
  rmSync(target, { recursive: true, force: true });
  console.error(`weightd: cuda.h not found (looked in ${candidates.slice(0, -1).join(', ')}) and ` +
    `fetching ${WHEEL} with pip failed: ${err.message}\n` +
    'Install the CUDA headers (Debian non-free: nvidia-cuda-dev) or set CUDA_HOME.');
  process.exit(1);
}
if (!existsSync(join(target, 'include', 'cuda.h'))) {
  console.error(`weightd: ${WHEEL} held no include/cuda.h; set CUDA_HOME to a CUDA toolkit`);
  process.exit(1);
}
