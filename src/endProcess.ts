// How the daemon's process ends. process.exit() joins libuv's threadpool and every worker thread
// before the process goes, so one thread blocked in a call that never returns (open() of a FIFO
// nobody writes, a hung network filesystem) holds the process forever, after the clean stop has
// already removed everything. A signal's default action joins nothing: the kernel ends every
// thread. So the process exits with its code when nothing is pending, and otherwise ends by a
// signal, which is also what a supervisor reads as "stopped by SIGTERM".

/**
 * Every signal a supervisor, a terminal or a closed session sends to end a process stops the
 * node cleanly: sockets, locks, node.json and segments go (docs/operations.md, "Signals").
 */
export const STOP_SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT'] as const;
export type StopSignal = (typeof STOP_SIGNALS)[number];

// Requests the main thread queued on libuv's threadpool (fs, dns lookups, crypto and zlib jobs).
const THREADPOOL_REQUEST = /^(FSReq|FileHandleCloseReq|GetAddrInfoReqWrap|GetNameInfoReqWrap|Zlib)|Job$/;

/** Threadpool requests still pending: each holds a thread that process.exit() would wait for. */
export function pendingThreadWork(): string[] {
  return process.getActiveResourcesInfo().filter((name) => THREADPOOL_REQUEST.test(name));
}

/**
 * Ends the process: exit `code` when no thread work is pending and `clean` (the stop finished);
 * otherwise by `signal` with its default action (SIGKILL when no stop signal came, and for
 * SIGQUIT, whose default action would dump core). Never returns.
 */
export function endProcess(code: number, signal: StopSignal | undefined, clean: boolean): never {
  // Default actions back first: were anything below to hang, the next signal ends the process.
  for (const s of STOP_SIGNALS) process.removeAllListeners(s);
  if (clean && pendingThreadWork().length === 0) process.exit(code);
  process.kill(process.pid, signal === undefined || signal === 'SIGQUIT' ? 'SIGKILL' : signal);
  // A signal to oneself is delivered before kill() returns; this line is for a blocked signal mask.
  process.exit(code);
}
