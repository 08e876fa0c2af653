// Before it could join: tell node 0 that this node failed, so a starting group fails now instead
// of at its rendezvous timeout.
import { connect } from 'node:net';
import type { SerializedError } from '../errors.js';
import { tokenProof } from './checkJoin.js';
import { PeerSocket } from './peerSocket.js';
import type { GroupTiming } from './timing.js';
import { parseServerMessage, type ServerMessage } from './groupMessages.js';

export interface StartupFailureReport {
  host: string;
  port: number;
  token?: string;
  nodeRank: number;
  hostName: string;
  error: SerializedError;
  timing: GroupTiming;
  /** Give up after this long: the node is exiting anyway. */
  timeoutMs: number;
}

/**
 * Tells node 0 that this node failed before it could join, so a starting group fails now
 * instead of at its rendezvous timeout. Node 0 may still be planning, so connecting is retried
 * (with the join's backoff) until `timeoutMs`. Best effort: resolves true once the report was
 * sent, false when node 0 could not be reached in time (it then names this node as missing).
 */
export async function reportStartupFailure(r: StartupFailureReport): Promise<boolean> {
  const deadline = performance.now() + r.timeoutMs;
  for (let delay = r.timing.retryMinMs; ; delay = Math.min(delay * 2, r.timing.retryMaxMs)) {
    const left = deadline - performance.now();
    if (left <= 0) return false;
    if (await sendStartupFailure(r, left)) return true;
    await new Promise((resolve) => setTimeout(resolve, Math.min(delay, Math.max(0, deadline - performance.now()))));
  }
}

/** One attempt: connect, wait for hello, send the report. */
function sendStartupFailure(r: StartupFailureReport, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    let sent = false;
    const socket = connect({ host: r.host, port: r.port });
    const conn: PeerSocket<ServerMessage> = new PeerSocket(socket, {
      parse: parseServerMessage,
      timing: r.timing,
      onMessage: (m) => {
        if (m.type !== 'hello' || sent) return;
        sent = true;
        const message = { type: 'abort', nodeRank: r.nodeRank, hostName: r.hostName, tokenProof: tokenProof(r.token, m.nonce), code: r.error.code, message: r.error.message.slice(0, 2000) } as const;
        void conn.send(message).then(() => conn.close('reported a start-up failure'));
      },
      onClose: () => {
        clearTimeout(timer);
        resolve(sent);
      },
    });
    const timer = setTimeout(() => conn.destroy('no answer from node 0 in time'), timeoutMs);
  });
}
