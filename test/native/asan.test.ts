// The host backend and the bindings under AddressSanitizer, with LeakSanitizer on: the addon is
// built a second time with -fsanitize=address into build-asan/ (CMakeLists.txt, WEIGHTD_ASAN),
// and asanScenario.ts drives it in a child node with the compiler's ASan runtime preloaded. Any
// memory error or leak either reports fails the test. (The CUDA backend's driver memory is
// checked by the fake libcuda, test/gpu/cudaBackendFake.test.ts.)
//
// No LSan suppression file: Node 20 frees its own heap on a clean exit (the scenario drains its
// event loop rather than calling process.exit), and a suppression matches any frame of a leak's
// stack, where Node's N-API frames sit under every allocation the addon makes from JS.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freshTempDir, repoRoot } from '../helpers/paths.js';

const scenario = fileURLToPath(new URL('./asanScenario.js', import.meta.url));
const cmakeJs = join(repoRoot, 'node_modules', 'cmake-js', 'bin', 'cmake-js');

/** The ASan runtime of the compiler that built build-asan/; it must be the first library loaded. */
function asanRuntime(): string {
  const cache = readFileSync(join(repoRoot, 'build-asan', 'CMakeCache.txt'), 'utf8');
  const compiler = /^CMAKE_CXX_COMPILER:\w+=(.+)$/m.exec(cache)?.[1] ?? 'c++';
  const r = spawnSync(compiler, ['-print-file-name=libasan.so'], { encoding: 'utf8' });
  const path = r.stdout?.trim() ?? '';
  if (r.status !== 0 || !path.startsWith('/')) {
    throw new Error(`${compiler} -print-file-name=libasan.so found no AddressSanitizer runtime (${r.error?.message ?? JSON.stringify(path)}); build with g++ and install its runtime (Debian: libasan8, a dependency of g++)`);
  }
  return path;
}

test.before(() => {
  // Ninja or make rebuild only what changed: once built, this takes about a second.
  const args = ['compile', '--out', 'build-asan', '--CDWEIGHTD_ASAN=ON', '--parallel', String(availableParallelism())];
  const r = spawnSync(process.execPath, [cmakeJs, ...args], { cwd: repoRoot, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`cannot build the ASan addon into build-asan/ (cmake-js compile --CDWEIGHTD_ASAN=ON):\n${r.stdout}\n${r.stderr}`);
});

test('allocate, fill, export, adopt, read, map, free, peer credentials, cancels and failures: no ASan error, no leak', () => {
  const child = spawnSync(process.execPath, ['--expose-gc', scenario, freshTempDir()], {
    cwd: repoRoot,
    encoding: 'utf8',
    env: { ...process.env, LD_PRELOAD: asanRuntime(), ASAN_OPTIONS: 'detect_leaks=1' },
  });
  const report = child.stderr.indexOf('==ERROR: ');
  assert.is(report, -1, `the sanitizer reported:\n${child.stderr.slice(Math.max(0, child.stderr.lastIndexOf('\n', report)), report + 20_000)}`);
  assert.is(child.status, 0, `the scenario failed (exit ${child.signal ?? child.status}):\n${child.stderr.slice(0, 20_000)}`);
  const { codes: { cancel, freeWhileFilling, ...codes }, ...result } = JSON.parse(child.stdout.trim().split('\n').pop()!);
  // Cancelled as it starts; only a fill of 16 MiB done between two JS statements escapes it.
  assert.match(cancel, /^(E_FILL_CANCELLED|no error)$/);
  assert.match(freeWhileFilling, /^(E_FILL_CANCELLED|no error)$/);
  assert.equal(codes, {
    fillBeforeAllocate: 'E_NOT_ALLOCATED',
    allocateTwice: 'E_ALREADY_ALLOCATED',
    pastEnd: 'E_BAD_PLAN',
    missingFile: 'E_FILE_OPEN',
    readOutOfRange: 'E_OUT_OF_RANGE',
    exportAfterFree: 'E_NOT_ALLOCATED',
    fillSealed: 'E_SEALED',
    fillAdopted: 'E_SEALED',
    adoptUnsealed: 'E_BAD_SEGMENT_FD',
    adoptShort: 'E_BAD_SEGMENT_FD',
    adoptCount: 'E_BAD_SEGMENT_FD',
    badBackend: 'E_BAD_BACKEND',
    tooBig: 'E_OUT_OF_MEMORY',
    mapUnsealed: 'E_SHM_OPEN',
    mapTooSmall: 'E_SHM_OPEN',
    peerOfFile: 'E_PEERCRED',
  });
  assert.equal(result, {
    loaded: { asanRuntime: true, asanAddon: true },
    readBack: true,
    mapped: true,
    adoptedBack: true,
    residencyFiles: true,
    peer: true,
    workerState: 'filling',
    held: [],
  });
});

test.run();
