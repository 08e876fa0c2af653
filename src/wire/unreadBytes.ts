// What a connection's peer has not read yet: the bytes still in our stream's buffer, and what the
// kernel still queues at the peer (addon().unreadBytes, SIOCOUTQ). The stream alone cannot tell a
// peer that reads nothing from one that reads: small frames fit the kernel's buffer for hours.
import type { Duplex } from 'node:stream';
import { addon } from '../native/addon.js';
import { streamFd } from './socketFdWriter.js';

/** 0 exactly when the peer has read everything written; otherwise a count in the kernel's accounting (buffer sizes, more than the bytes). */
export function unreadBytes(stream: Duplex): number {
  const fd = streamFd(stream);
  let queued = 0;
  try {
    if (fd !== undefined) queued = addon().unreadBytes(fd);
  } catch {
    // The descriptor is being closed under us: the connection's 'close' follows.
  }
  return stream.writableLength + queued;
}
