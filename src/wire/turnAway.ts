// How a listener closes a connection it refuses (over its connection cap, a request not complete
// within its read deadline, a device socket's protocol violation) after telling the peer why.
import type { Duplex } from 'node:stream';

/** How long a refused connection stays half-open, so that its peer reads why. */
export const REFUSAL_GRACE_MS = 1000;

/**
 * Tells a refused peer why (`frame`, the reply to its request) and ends the connection. Not
 * destroyed at once: a peer whose request is written after a full close gets EPIPE, and its
 * socket is torn down with the reply unread (the client then sees only a hang-up). What it sends
 * is discarded; the socket is destroyed once the peer closes, or after REFUSAL_GRACE_MS.
 */
export function turnAway(socket: Duplex, frame: Uint8Array): void {
  if (socket.destroyed) return;
  const grace = setTimeout(() => socket.destroy(), REFUSAL_GRACE_MS).unref();
  socket.once('close', () => clearTimeout(grace));
  socket.on('error', () => {});
  socket.resume();
  socket.end(frame);
}
