// What the host backend holds, read from /proc: its segments are memfds named
// "weightd:<device>:s<i>" (native/host_device.cpp), which /proc/PID/fd shows as
// "/memfd:weightd:<device>:s<i> (deleted)". A segment that is freed leaves no descriptor, and a
// memfd has no name in any directory, so these are the exact leak checks the old /dev/shm
// listings were.
import { readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';

/** Where each of the process's descriptors points (/proc/PID/fd). */
export function fdTargets(pid: number | 'self'): string[] {
  const dir = `/proc/${pid}/fd`;
  const out: string[] = [];
  for (const fd of readdirSync(dir)) {
    try {
      out.push(readlinkSync(`${dir}/${fd}`));
    } catch {
      // closed between the listing and the read (the listing's own descriptor, for one)
    }
  }
  return out;
}

/** The process's descriptors that are host-backend segments. */
export function weightdMemfds(pid: number | 'self' = 'self'): string[] {
  return fdTargets(pid).filter((t) => t.startsWith('/memfd:weightd:'));
}

/**
 * Bytes this process's host-backend segments hold (their memfds' sizes), each memfd once however
 * many descriptors it has (versions that share a segment each hold their own).
 */
export function weightdMemfdBytes(): number {
  const sizes = new Map<number, number>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (!readlinkSync(`/proc/self/fd/${fd}`).startsWith('/memfd:weightd:')) continue;
      const st = statSync(`/proc/self/fd/${fd}`);
      sizes.set(st.ino, st.size);
    } catch {
      // closed meanwhile
    }
  }
  return [...sizes.values()].reduce((a, b) => a + b, 0);
}

/** How many descriptors the process has open: what an fd-passing path must leave unchanged. */
export function openFdCount(pid: number | 'self' = 'self'): number {
  return fdTargets(pid).length;
}

/** Files under /dev/shm the process has open or mapped (a host backend that used named files would show here). */
export function devShmFilesOf(pid: number | 'self'): string[] {
  const maps = readFileSync(`/proc/${pid}/maps`, 'utf8').split('\n').map((l) => l.split(/\s+/).slice(5).join(' '));
  return [...new Set([...fdTargets(pid), ...maps].filter((t) => t.startsWith('/dev/shm/')))];
}
