// The rendezvous clocks. Defaults suit real clusters; tests shrink them through the environment
// (or GroupSessionInput.timing), since waiting 5 s for each lost heartbeat would make a suite of
// failure scenarios take minutes.
import { envOverrides } from '../envOverrides.js';
import { UsageError } from '../errors.js';

export interface GroupTiming {
  /** Interval between heartbeats, both ways, on every rendezvous connection. */
  heartbeatMs: number;
  /** A connection silent for longer than this is lost (its node is reported or fails the group). */
  peerTimeoutMs: number;
  /** First retry delay when node 0 cannot be reached; doubles on each failure ... */
  retryMinMs: number;
  /** ... up to this cap, also the pace of reconnecting to a lost node 0 while serving. */
  retryMaxMs: number;
  /** How long a client waits for the coordinator's hello. */
  handshakeMs: number;
  /**
   * How long the coordinator waits for a new connection's join. Short: a real node sends it one
   * round trip after connecting, and until then the connection holds a slot of the pending
   * budget that strangers compete for.
   */
  joinMs: number;
}

export const DEFAULT_GROUP_TIMING: GroupTiming = {
  heartbeatMs: 1000,
  peerTimeoutMs: 5000,
  retryMinMs: 100,
  retryMaxMs: 2000,
  handshakeMs: 10_000,
  joinMs: 2000,
};

/** Environment variables that override the defaults, in milliseconds. */
export const TIMING_ENV: Record<keyof GroupTiming, string> = {
  heartbeatMs: 'WEIGHTD_RDZV_HEARTBEAT_MS',
  peerTimeoutMs: 'WEIGHTD_RDZV_PEER_TIMEOUT_MS',
  retryMinMs: 'WEIGHTD_RDZV_RETRY_MIN_MS',
  retryMaxMs: 'WEIGHTD_RDZV_RETRY_MAX_MS',
  handshakeMs: 'WEIGHTD_RDZV_HANDSHAKE_MS',
  joinMs: 'WEIGHTD_RDZV_JOIN_MS',
};

/** The defaults, overridden by the environment and then by `over`; checked for consistency. */
export function groupTiming(over: Partial<GroupTiming> = {}, env: NodeJS.ProcessEnv = process.env): GroupTiming {
  const t: GroupTiming = { ...DEFAULT_GROUP_TIMING, ...envOverrides(DEFAULT_GROUP_TIMING, TIMING_ENV, env, 'whole number of milliseconds'), ...over };
  if (t.peerTimeoutMs <= t.heartbeatMs * 2) {
    throw new UsageError(
      'E_USAGE',
      `${TIMING_ENV.peerTimeoutMs} ${t.peerTimeoutMs} must exceed twice ${TIMING_ENV.heartbeatMs} ${t.heartbeatMs}, else one late heartbeat reads as a lost peer`,
    );
  }
  if (t.retryMinMs > t.retryMaxMs) {
    throw new UsageError('E_USAGE', `${TIMING_ENV.retryMinMs} ${t.retryMinMs} exceeds ${TIMING_ENV.retryMaxMs} ${t.retryMaxMs}; make the first retry delay the smaller one`);
  }
  return t;
}
