// Whether a process named by a lease or a lock file still runs. A bare pid is not enough: pids
// are reused, and a lease whose client died must not be kept alive by an unrelated process that
// later got the same pid. Linux's /proc/<pid>/stat start time (clock ticks since boot) tells
// the two apart; where /proc is missing, the pid alone is used. A zombie (exited, not yet
// reaped by its parent) still answers kill(pid, 0), and in a container whose PID 1 reaps slowly
// a killed daemon stays one for a while: its state field says it is gone. The rule, shared with
// the Python client: docs/spec/liveness.md.
import { readFileSync } from 'node:fs';

export interface ProcessIdentity {
  pid: number;
  /** Field 22 of /proc/<pid>/stat, when it could be read. */
  startTime?: string;
}

/** States of a process that has exited: Z, a zombie its parent has not reaped; X, dead. */
const EXITED_STATES = new Set(['Z', 'X']);

/** The fields of a /proc/<pid>/stat line from field 3 on, counted after the command name's last ')'; undefined without one. */
function fieldsAfterName(stat: string): string[] | undefined {
  // The command name (field 2) may hold spaces and parentheses.
  const close = stat.lastIndexOf(')');
  if (close < 0) return undefined;
  return stat.slice(close + 2).replace(/\n$/, '').split(' ');
}

/** Field 22 of a /proc/<pid>/stat line (docs/spec/liveness.md, test/vectors/liveness.json). */
export function startTimeFromStat(stat: string): string | undefined {
  return fieldsAfterName(stat)?.[19];
}

/** Field 3 of a /proc/<pid>/stat line, the process state (R, S, D, Z, ...). */
export function stateFromStat(stat: string): string | undefined {
  const state = fieldsAfterName(stat)?.[0];
  return state === '' ? undefined : state;
}

/** /proc/<pid>/stat, or undefined when it cannot be read (gone, or no /proc). */
function readStat(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch {
    return undefined;
  }
}

export function processIdentity(pid: number): ProcessIdentity {
  const stat = pid > 0 ? readStat(pid) : undefined;
  const startTime = stat === undefined ? undefined : startTimeFromStat(stat);
  return startTime === undefined ? { pid } : { pid, startTime };
}

let own: ProcessIdentity | undefined;

/**
 * This process's identity, read from /proc once: its start time cannot change (a forked child is
 * another pid, read anew). The node manifest is written with it at every model change, and the
 * read was a third of that write's time on a commit's path (bench/RESULTS.md, 2026-12-07).
 */
export function ownProcessIdentity(): ProcessIdentity {
  if (own?.pid !== process.pid) own = processIdentity(process.pid);
  return own;
}

export function isProcessAlive(id: ProcessIdentity): boolean {
  if (!Number.isInteger(id.pid) || id.pid <= 0) return false;
  try {
    process.kill(id.pid, 0);
  } catch (err) {
    // EPERM: it exists but belongs to another user; only ESRCH means gone.
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  const stat = readStat(id.pid);
  if (stat !== undefined && EXITED_STATES.has(stateFromStat(stat) ?? '')) return false;
  return id.startTime === undefined || (stat !== undefined && startTimeFromStat(stat) === id.startTime);
}
