import { readdirSync, statSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { isProcessAlive } from '../serve/processLiveness.js';

const SEGMENT = /^weightd-(\d+)-.*-s\d+$/;

/**
 * Removes host-backend segment files whose daemon (the pid in the name) is gone: a daemon
 * killed with SIGKILL cannot clean up after itself, and tmpfs pages are memory.
 * Only this user's files are touched. Returns the paths removed.
 */
export function sweepStaleSegments(dir: string): string[] {
  const removed: string[] = [];
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return removed;
  }
  const uid = process.getuid?.();
  for (const name of names) {
    const m = SEGMENT.exec(name);
    if (!m || isProcessAlive({ pid: Number(m[1]) })) continue;
    const path = join(dir, name);
    try {
      if (uid !== undefined && statSync(path).uid !== uid) continue;
      unlinkSync(path);
      removed.push(path);
    } catch {
      // Raced with another sweeper or the file's owner: nothing to do.
    }
  }
  return removed;
}
