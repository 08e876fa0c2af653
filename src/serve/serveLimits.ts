// The deadlines and bounds a rank's socket server works within, and where they come from.
import { envOverrides } from '../envOverrides.js';
import type { ConnectionLimits } from './clientConnection.js';
import { MAX_REQUEST_BYTES } from '../wire/frameCodec.js';

export interface ServeLimits extends ConnectionLimits {
  /** How often leases of exited clients are looked for (they are also checked on release). */
  leaseSweepMs: number;
  /** The most connections the socket holds; beyond them (or its share of the descriptor budget, descriptorBudget.ts) one is closed at once. */
  maxConnections: number;
  /**
   * The most of those connections that watch (watchTable.ts): a watcher is never idle-closed, so
   * without a budget of their own watchers could hold every connection and leave none to attach.
   */
  maxWatchers: number;
  /** Log window of peer-caused lines (protocol errors, refusals): 20 lines, then a count. */
  logWindowMs: number;
  /**
   * How long a check of a version's checkpoint files stands (src/serve/filesCheck.ts): a
   * get_state within this of the last check's start is not checked again. 0: every one is.
   */
  filesCheckMs: number;
}

export const DEFAULT_SERVE_LIMITS: ServeLimits = {
  maxRequestBytes: MAX_REQUEST_BYTES,
  readTimeoutMs: 5_000,
  idleTimeoutMs: 60_000,
  eventReadTimeoutMs: 60_000,
  leaseSweepMs: 2_000,
  maxConnections: 1024,
  maxWatchers: 256,
  logWindowMs: 10_000,
  filesCheckMs: 1_000,
};

/**
 * Environment variables that override the defaults (tests shrink the deadlines, as the
 * rendezvous tests do with WEIGHTD_RDZV_*). The request size bound is not tunable.
 */
export const SERVE_LIMITS_ENV: Record<Exclude<keyof ServeLimits, 'maxRequestBytes' | 'filesCheckMs'>, string> = {
  readTimeoutMs: 'WEIGHTD_SERVE_READ_TIMEOUT_MS',
  idleTimeoutMs: 'WEIGHTD_SERVE_IDLE_TIMEOUT_MS',
  eventReadTimeoutMs: 'WEIGHTD_SERVE_EVENT_READ_TIMEOUT_MS',
  leaseSweepMs: 'WEIGHTD_SERVE_LEASE_SWEEP_MS',
  maxConnections: 'WEIGHTD_SERVE_MAX_CONNECTIONS',
  maxWatchers: 'WEIGHTD_SERVE_MAX_WATCHERS',
  logWindowMs: 'WEIGHTD_SERVE_LOG_WINDOW_MS',
};

/** The one that may be 0 (check the files at every get_state). */
export const FILES_CHECK_ENV = { filesCheckMs: 'WEIGHTD_SERVE_FILES_CHECK_MS' };

/** The defaults, overridden by the environment and then by `over`. */
export function serveLimits(over: Partial<ServeLimits> = {}, env: NodeJS.ProcessEnv = process.env): ServeLimits {
  return {
    ...DEFAULT_SERVE_LIMITS,
    ...envOverrides(DEFAULT_SERVE_LIMITS, SERVE_LIMITS_ENV, env),
    ...envOverrides({ filesCheckMs: DEFAULT_SERVE_LIMITS.filesCheckMs }, FILES_CHECK_ENV, env, 'whole number of milliseconds', 0),
    ...over,
  };
}
