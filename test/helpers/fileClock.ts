// File timestamps come from the kernel's coarse clock (a tick of 1-10 ms), so a write in the same
// tick as an earlier stat leaves ctime as it was (docs/spec/file-identity.md, the window). A test
// that changes a file to see the change first waits, on a scratch file of the same file system,
// for that clock to pass the file's ctime: a condition, not a sleep.
import { rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';

/** Returns once a file written in `path`'s directory gets a ctime later than `path`'s. */
export function afterCtimeOf(path: string): void {
  const before = statSync(path, { bigint: true }).ctimeNs;
  const scratch = join(dirname(path), `.clock-${process.pid}`);
  try {
    for (let i = 0; i < 10_000_000; i++) {
      writeFileSync(scratch, String(i));
      if (statSync(scratch, { bigint: true }).ctimeNs > before) return;
    }
    throw new Error(`the file system's clock did not pass ${path}'s ctime`);
  } finally {
    rmSync(scratch, { force: true });
  }
}
