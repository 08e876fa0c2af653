// Whether a new connection on a Unix socket (a device's, the control socket) is served: the
// kernel says (SO_PEERCRED) that its peer runs as this user, and then its listener's share of the
// descriptor budget has room for it. An admitted connection holds its descriptor in the share until
// it is destroyed. The listener logs, counts and closes what is refused, on its one rate-limited
// budget of peer-caused lines.
import type { Socket } from 'node:net';
import { addon } from '../native/addon.js';
import type { ListenerShare } from './descriptorBudget.js';
import { streamFd } from './socketFdWriter.js';

export interface AdmissionRules {
  /** Our uid: the only one served. */
  uid: number;
  share: ListenerShare;
}

export type Admission =
  | { admitted: true; pid: number }
  /**
   * `otherUser`: a peer of another uid, which counts as a refused peer in stats. `full`: refused
   * for want of room (the peer may try again later), not for who it is.
   */
  | { admitted: false; otherUser: boolean; full: boolean; fields: Record<string, unknown>; message: string };

export function admitPeer(socket: Socket, rules: AdmissionRules): Admission {
  const fd = streamFd(socket);
  let peer;
  try {
    if (fd === undefined) throw new Error('the socket has no file descriptor');
    peer = addon().peerCredentials(fd);
  } catch (err) {
    return { admitted: false, otherUser: false, full: false, fields: { err: (err as Error).message }, message: 'cannot read the peer credentials of a client: refused it' };
  }
  if (peer.uid !== rules.uid) {
    // Unreachable with a 0600 socket in a 0700 directory, unless someone widened them, or
    // the peer is root; refusing root as well keeps "only this user" exact.
    return { admitted: false, otherUser: true, full: false, fields: { peerUid: peer.uid, peerPid: peer.pid, uid: rules.uid }, message: 'refused a client of another user' };
  }
  // Who it is before whether there is room: a peer of another user is told nothing, not even the limit.
  const refused = rules.share.take(socket);
  if (refused) return { admitted: false, otherUser: false, full: true, fields: { limit: refused.limit, why: refused.message }, message: 'too many client connections: refused one' };
  return { admitted: true, pid: peer.pid };
}
