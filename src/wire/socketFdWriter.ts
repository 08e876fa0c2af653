// How a connection's reply with descriptors goes out: the frame and its fds written straight to
// the socket's descriptor with sendmsg (addon().sendWithFds, SCM_RIGHTS in batches), since Node's
// streams cannot carry fds on a net.Socket. ClientConnection calls it only once everything it
// wrote before has reached the kernel, so the bytes of two replies never interleave.
import type { Duplex } from 'node:stream';
import { ServeError } from '../errors.js';
import { addon } from '../native/addon.js';

/** Writes `frame` with `fds` attached within `timeoutMs`; rejects when it could not (the stream is then unusable). */
export type FdWriter = (frame: Buffer, fds: number[], timeoutMs: number) => Promise<void>;

/** The descriptor behind a net.Socket (libuv's), as SO_PEERCRED is read too; undefined for other streams. */
export function streamFd(stream: Duplex): number | undefined {
  const fd = (stream as unknown as { _handle?: { fd?: number } })._handle?.fd;
  return fd === undefined || fd < 0 ? undefined : fd;
}

export function socketFdWriter(stream: Duplex): FdWriter {
  return (frame, fds, timeoutMs) => {
    const fd = streamFd(stream);
    if (fd === undefined) return Promise.reject(new ServeError('E_NO_FDS', 'this connection is not a Unix socket: it cannot carry descriptors'));
    return addon().sendWithFds(fd, frame, fds, timeoutMs);
  };
}
