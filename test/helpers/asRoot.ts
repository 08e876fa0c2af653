// Tests that need root (to make a directory another user owns, or to connect as another uid):
// elsewhere each is skipped with a "SKIPPED: why" line (test/run.mjs lists them), never passed
// without running.
import type { Test } from 'uvu';

const isRoot = process.getuid?.() === 0;

export function asRoot(test: Test, name: string, why: string, body: () => unknown | Promise<unknown>): void {
  if (isRoot) {
    test(name, body as () => void);
    return;
  }
  console.log(`SKIPPED: ${name}: needs root (${why})`);
  test.skip(name, () => {});
}
