import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Repository root (tests run from dist/test/...). */
export const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));
export const exampleModel = `${repoRoot}examples/tiny-llama`;
export const mainJs = `${repoRoot}dist/main.js`;

const made: string[] = [];
// Removed when the test process ends, however it ends short of SIGKILL: callers need not
// remember, and a failed assertion cannot leave its directory behind. Synchronous on purpose:
// 'exit' handlers cannot wait.
process.on('exit', () => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

function tempDir(prefix: string): string {
  const dir = mkdtempSync(prefix);
  made.push(dir);
  return dir;
}

/** A private directory for one test's files (checkpoints, plans). */
export function freshTempDir(): string {
  return tempDir(join(tmpdir(), 'weightd-test-'));
}

/** A private socket directory for one daemon, so test files running in parallel never share device locks. */
export function freshSocketDir(): string {
  return tempDir(join(tmpdir(), 'weightd-sock-'));
}
