import { mkdtempSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** Repository root (tests run from dist/test/...). */
export const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));
export const exampleModel = `${repoRoot}examples/tiny-llama`;
export const mainJs = `${repoRoot}dist/main.js`;

/** A private directory on tmpfs for one test's shared-memory segments, so leftovers are exact. */
export function freshShmDir(): string {
  return mkdtempSync('/dev/shm/weightd-test-');
}
