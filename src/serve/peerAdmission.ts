// Whether a new connection on a rank's socket is served: there is room for it, and the kernel
// says (SO_PEERCRED) that its peer runs as this user. It only decides: the rank server logs,
// counts and closes what is refused, on its one rate-limited budget of peer-caused lines.
import type { Socket } from 'node:net';
import { addon } from '../native/addon.js';
import { streamFd } from './socketFdWriter.js';

export interface AdmissionRules {
  /** Our uid: the only one served. */
  uid: number;
  openConnections: number;
  maxConnections: number;
}

export type Admission =
  | { admitted: true; pid: number }
  /** `otherUser`: a peer of another uid, which counts as a refused peer in stats. */
  | { admitted: false; otherUser: boolean; fields: Record<string, unknown>; message: string };

export function admitPeer(socket: Socket, rules: AdmissionRules): Admission {
  if (rules.openConnections >= rules.maxConnections) {
    return { admitted: false, otherUser: false, fields: { limit: rules.maxConnections }, message: 'too many client connections: refused one' };
  }
  const fd = streamFd(socket);
  let peer;
  try {
    if (fd === undefined) throw new Error('the socket has no file descriptor');
    peer = addon().peerCredentials(fd);
  } catch (err) {
    return { admitted: false, otherUser: false, fields: { err: (err as Error).message }, message: 'cannot read the peer credentials of a client: refused it' };
  }
  if (peer.uid !== rules.uid) {
    // Unreachable with a 0600 socket in a 0700 directory, unless someone widened them, or
    // the peer is root; refusing root as well keeps "only this user" exact.
    return { admitted: false, otherUser: true, fields: { peerUid: peer.uid, peerPid: peer.pid, uid: rules.uid }, message: 'refused a client of another user' };
  }
  return { admitted: true, pid: peer.pid };
}
