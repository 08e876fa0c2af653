// Whether a process named by a lease or a lock file still runs. A bare pid is not enough: pids
// are reused, and a lease whose client died must not be kept alive by an unrelated process that
// later got the same pid. Linux's /proc/<pid>/stat start time (clock ticks since boot) tells
// the two apart; where /proc is missing, the pid alone is used. The rule, shared with the Python
// client: docs/spec/liveness.md.
import { readFileSync } from 'node:fs';

export interface ProcessIdentity {
  pid: number;
  /** Field 22 of /proc/<pid>/stat, when it could be read. */
  startTime?: string;
}

/** Field 22 of a /proc/<pid>/stat line (docs/spec/liveness.md, test/vectors/liveness.json). */
export function startTimeFromStat(stat: string): string | undefined {
  // The command name (field 2) may hold spaces and parentheses: count fields after its last ')'.
  const close = stat.lastIndexOf(')');
  if (close < 0) return undefined;
  return stat.slice(close + 2).replace(/\n$/, '').split(' ')[19];
}

/** The start time of `pid`, or undefined when it cannot be read (gone, or no /proc). */
function startTimeOf(pid: number): string | undefined {
  try {
    return startTimeFromStat(readFileSync(`/proc/${pid}/stat`, 'latin1'));
  } catch {
    return undefined;
  }
}

export function processIdentity(pid: number): ProcessIdentity {
  const startTime = pid > 0 ? startTimeOf(pid) : undefined;
  return startTime === undefined ? { pid } : { pid, startTime };
}

export function isProcessAlive(id: ProcessIdentity): boolean {
  if (!Number.isInteger(id.pid) || id.pid <= 0) return false;
  try {
    process.kill(id.pid, 0);
  } catch (err) {
    // EPERM: it exists but belongs to another user; only ESRCH means gone.
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  return id.startTime === undefined || startTimeOf(id.pid) === id.startTime;
}
