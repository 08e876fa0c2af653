// Load progress from the ranks' own counters: bytes resident, bytes planned and seconds spent
// filling, as each rank's worker reports them. One computation for the log lines, the progress
// bar, /status and /metrics, so they never disagree.
import type { RankStatus } from '../nodeStatus.js';

export interface LoadProgress {
  bytes: number;
  totalBytes: number;
  /** Seconds spent filling (the longest rank's, for a node). */
  seconds: number;
  /** Average since the fill began; null before the first byte. */
  bytesPerSecond: number | null;
  /** Seconds left at that rate; 0 once resident, null while unknown (not started, or stopped). */
  etaSeconds: number | null;
}

function remainingSeconds(r: Pick<RankStatus, 'state' | 'bytes' | 'totalBytes'>, rate: number | null): number | null {
  if (r.state === 'loaded' || r.state === 'serving') return 0;
  if (r.state !== 'loading' || rate === null) return null;
  return Math.max(0, r.totalBytes - r.bytes) / rate;
}

export function rankProgress(r: RankStatus): LoadProgress {
  const bytesPerSecond = r.seconds > 0 && r.bytes > 0 ? r.bytes / r.seconds : null;
  return { bytes: r.bytes, totalBytes: r.totalBytes, seconds: r.seconds, bytesPerSecond, etaSeconds: remainingSeconds(r, bytesPerSecond) };
}

/**
 * The node as a whole. Ranks fill side by side, so the node's rate is all bytes over the
 * longest rank's time, and it is done when its slowest rank is.
 */
export function nodeProgress(ranks: readonly RankStatus[]): LoadProgress {
  const each = ranks.map(rankProgress);
  const bytes = each.reduce((a, p) => a + p.bytes, 0);
  const seconds = Math.max(0, ...each.map((p) => p.seconds));
  const etas = each.map((p) => p.etaSeconds);
  return {
    bytes,
    totalBytes: each.reduce((a, p) => a + p.totalBytes, 0),
    seconds,
    bytesPerSecond: seconds > 0 && bytes > 0 ? bytes / seconds : null,
    etaSeconds: etas.length === 0 || etas.includes(null) ? null : Math.max(...(etas as number[])),
  };
}

/** Decimal units throughout, as link and disk speeds are quoted (GB/s). */
export function formatBytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${n} B`;
}

export function formatRate(bytesPerSecond: number | null): string {
  return bytesPerSecond === null ? '? GB/s' : `${formatBytes(Math.round(bytesPerSecond))}/s`;
}

export function formatSeconds(s: number | null): string {
  if (s === null) return '?';
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 10) return `${s.toFixed(1)} s`;
  const whole = Math.round(s);
  if (whole < 120) return `${whole} s`;
  return `${Math.floor(whole / 60)} min ${whole % 60} s`;
}

export function percent(p: Pick<LoadProgress, 'bytes' | 'totalBytes'>): number {
  return p.totalBytes > 0 ? Math.min(100, (100 * p.bytes) / p.totalBytes) : 0;
}
