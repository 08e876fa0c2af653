import { readdirSync, readlinkSync, statSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { isProcessAlive } from '../serve/processLiveness.js';

// weightd-<pid>-<pid namespace inode>-<device>-<random>-s<segment> (native/host_device.cpp).
const SEGMENT = /^weightd-(\d+)-(\d+)-.*-s\d+$/;

/** This process's pid namespace inode, as the addon writes it into segment names ('0': unknown). */
export function pidNamespaceId(): string {
  try {
    return /\d+/.exec(readlinkSync('/proc/self/ns/pid'))?.[0] ?? '0';
  } catch {
    return '0';
  }
}

/**
 * Removes host-backend segment files whose daemon (the pid in the name) is gone: a daemon
 * killed with SIGKILL cannot clean up after itself, and tmpfs pages are memory. Only this
 * user's files, and only those written in this pid namespace (a pid of another namespace may
 * belong to a live daemon that shares the directory). Returns the paths removed.
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
  const ns = pidNamespaceId();
  if (ns === '0') return removed;
  for (const name of names) {
    const m = SEGMENT.exec(name);
    if (!m || m[2] !== ns || isProcessAlive({ pid: Number(m[1]) })) continue;
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
