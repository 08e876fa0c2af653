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

/** Writes `frame` with `fds` attached within `timeoutMs`; rejects when it could not (the stream is then unusable). */
export type FdWriter = (frame: Buffer, fds: number[], timeoutMs: number) => Promise<void>;

/** The longest wait between two tries on a full socket: how late a slow reader may get the rest. */
const MAX_RETRY_MS = 50;

/** The descriptor behind a net.Socket (libuv's), as SO_PEERCRED is read too; undefined for other streams. */
export function streamFd(stream: Duplex): number | undefined {
  const fd = (stream as unknown as { _handle?: { fd?: number } })._handle?.fd;
  return fd === undefined || fd < 0 ? undefined : fd;
}

/**
 * Sends every byte of `frame` with `fds` on the connected AF_UNIX stream socket `socketFd` within
 * `timeoutMs`. The caller keeps its fds and the socket open until it settles. E_FD_SEND,
 * E_FD_TIMEOUT.
 */
export async function sendFds(socketFd: number, frame: Buffer, fds: number[], timeoutMs: number): Promise<void> {
  const pending = addon().fdSendStart(socketFd, frame, fds);
  if (pending === null) return;
  const deadline = performance.now() + timeoutMs;
  for (let wait = 1; ; wait = Math.min(2 * wait, MAX_RETRY_MS)) {
    const left = deadline - performance.now();
    await sleep(Math.max(0, Math.min(wait, left)));
    if (addon().fdSendSome(pending, performance.now() >= deadline, timeoutMs)) return;
  }
}

export function socketFdWriter(stream: Duplex): FdWriter {
  return (frame, fds, timeoutMs) => {
    const fd = streamFd(stream);
    if (fd === undefined) return Promise.reject(new ServeError('E_NO_FDS', 'this connection is not a Unix socket: it cannot carry descriptors'));
    return sendFds(fd, frame, fds, timeoutMs);
  };
}
