// Whether a process named by a lease or a lock file still runs. A bare pid is not enough: pids
// are reused, and a lease whose client died must not be kept alive by an unrelated process that
// later got the same pid. Linux's /proc/<pid>/stat start time (clock ticks since boot) tells
// the two apart; where /proc is missing, the pid alone is used.
import { readFileSync } from 'node:fs';

export interface ProcessIdentity {
  pid: number;
  /** Field 22 of /proc/<pid>/stat, when it could be read. */
  startTime?: string;
}

/** The start time of `pid`, or undefined when it cannot be read (gone, or no /proc). */
function startTimeOf(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    // The command name (field 2) may hold spaces and parentheses: count fields after its last ')'.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return rest[19];
  } catch {
    return undefined;
  }
}

export function processIdentity(pid: number): ProcessIdentity {
  const startTime = pid > 0 ? startTimeOf(pid) : undefined;
  return startTime === undefined ? { pid } : { pid, startTime };
}

export function isProcessAlive(id: ProcessIdentity): boolean {
  if (!(id.pid > 0)) return false;
  try {
    process.kill(id.pid, 0);
  } catch (err) {
    // EPERM: it exists but belongs to another user; only ESRCH means gone.
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  return id.startTime === undefined || startTimeOf(id.pid) === id.startTime;
}
