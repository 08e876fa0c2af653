// How a connection's reply with descriptors goes out: the frame and its fds written straight to
// the socket's descriptor with sendmsg (SCM_RIGHTS in batches), since Node's streams cannot carry
// fds on a net.Socket. ClientConnection calls it only once everything it wrote before has reached
// the kernel, so the bytes of two replies never interleave.
//
// It never waits on a thread: what the socket takes at once goes at once (almost every reply),
// and a socket that is full is tried again on the event loop, after 1 ms, then 2, 4, ... at most
// 50 ms apart, until its deadline. A peer that stops reading costs a timer, where a send waiting
// in the addon held one of libuv's four threads for its whole deadline, and four such peers
// stalled every allocation, free, seal and keeper request of the daemon.
import type { Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { ServeError } from '../errors.js';
import { addon } from '../native/addon.js';

/**
 * Writes `frame` with `fds` attached within `timeoutMs`; rejects when it could not (the stream is
 * then unusable). Once `signal` aborts (the connection is closing), it gives up at once.
 */
export type FdWriter = (frame: Buffer, fds: number[], timeoutMs: number, signal?: AbortSignal) => Promise<void>;

/** The longest wait between two tries on a full socket: how late a slow reader may get the rest. */
const MAX_RETRY_MS = 50;

/** The descriptor behind a net.Socket (libuv's), as SO_PEERCRED is read too; undefined for other streams. */
export function streamFd(stream: Duplex): number | undefined {
  const fd = (stream as unknown as { _handle?: { fd?: number } })._handle?.fd;
  return fd === undefined || fd < 0 ? undefined : fd;
}

/**
 * Sends every byte of `frame` with `fds` on the connected AF_UNIX stream socket `socketFd` within
 * `timeoutMs`. The caller keeps its fds open until it settles; the socket it may close once the
 * first try returned (the rest goes on a duplicate, which an abort of `signal` closes at once).
 * E_FD_SEND (also when aborted), E_FD_TIMEOUT.
 */
export async function sendFds(socketFd: number, frame: Buffer, fds: number[], timeoutMs: number, signal?: AbortSignal): Promise<void> {
  const started = addon().fdSendStart(socketFd, frame, fds);
  if (started === null) return;
  const { pending } = started;
  const deadline = performance.now() + timeoutMs;
  let left = started.left;
  // The wait doubles while the peer reads nothing and starts again at 1 ms once it read some: a
  // reader that takes a large reply in pieces is not kept 50 ms behind for each of them.
  for (let wait = 1; ; ) {
    const untilDeadline = deadline - performance.now();
    try {
      await sleep(Math.max(0, Math.min(wait, untilDeadline)), undefined, { signal });
    } catch {
      addon().fdSendEnd(pending);
      throw new ServeError('E_FD_SEND', `the connection closed with ${left} of the ${frame.length} bytes of its reply (and its ${fds.length} fds) unsent`, { left, bytes: frame.length });
    }
    const now = addon().fdSendSome(pending, performance.now() >= deadline, timeoutMs);
    if (now === 0) return;
    wait = now < left ? 1 : Math.min(2 * wait, MAX_RETRY_MS);
    left = now;
  }
}

export function socketFdWriter(stream: Duplex): FdWriter {
  return (frame, fds, timeoutMs, signal) => {
    const fd = streamFd(stream);
    if (fd === undefined) return Promise.reject(new ServeError('E_NO_FDS', 'this connection is not a Unix socket: it cannot carry descriptors'));
    return sendFds(fd, frame, fds, timeoutMs, signal);
  };
}
