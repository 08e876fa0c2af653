// How the daemon's process ends. process.exit() joins libuv's threadpool and every worker thread
// before the process goes, so one thread blocked in a call that never returns (open() of a FIFO
// nobody writes, a hung network filesystem) holds the process forever, after the clean stop has
// already removed everything. A signal's default action joins nothing: the kernel ends every
// thread. So the process exits with its code when nothing is pending, and otherwise ends by a
// signal, which is also what a supervisor reads as "stopped by SIGTERM".
// Pending is not stuck: a request whose promise has just settled stays listed until the callback
// that settled it returns, and a read still in flight when a failure ended the start finishes in
// milliseconds. Taking either for a blocked thread ended failed starts by SIGKILL (137) instead
// of their exit code 1 or 2, one run in two. So the end first lets in-flight work finish, for a
// bounded grace, and only what is still pending after it counts as blocked.

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
 * How long the end waits for thread work in flight to finish. A local read or stat takes
 * milliseconds even on a loaded machine; a thread still busy after this is blocked for good (a
 * hung network filesystem), and waiting longer would only delay a supervisor's restart.
 */
export const THREAD_WORK_GRACE_MS = 2_000;
/** How often the grace looks again: often enough to add nothing noticeable to an exit. */
const THREAD_WORK_POLL_MS = 10;

/**
 * Waits until no threadpool request is pending, or `graceMs` has passed; returns what is still
 * pending then (nothing: the process can exit with its code).
 */
export async function settledThreadWork(graceMs = THREAD_WORK_GRACE_MS): Promise<string[]> {
  const until = Date.now() + graceMs;
  for (;;) {
    // One turn of the event loop first: it closes the callback scopes of requests that have
    // already completed, which is all that is pending after most failures.
    await new Promise((resolve) => setImmediate(resolve));
    const pending = pendingThreadWork();
    if (pending.length === 0 || Date.now() >= until) return pending;
    await new Promise((resolve) => setTimeout(resolve, THREAD_WORK_POLL_MS));
  }
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
