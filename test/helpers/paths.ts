import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Repository root (tests run from dist/test/...). */
export const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));
export const exampleModel = `${repoRoot}examples/tiny-llama`;
export const mainJs = `${repoRoot}dist/main.js`;

/** A private directory on tmpfs for one test's shared-memory segments, so leftovers are exact. */
export function freshShmDir(): string {
  return mkdtempSync('/dev/shm/weightd-test-');
}

/** A private socket directory for one daemon, so test files running in parallel never share device locks. */
export function freshSocketDir(): string {
  return mkdtempSync(join(tmpdir(), 'weightd-sock-'));
}
