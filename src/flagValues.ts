// The checks every flag and option shares: one wording for a bad value (E_USAGE naming the flag,
// the value and what to do) wherever it is read, by node options, model specs or the eviction
// policy alike.
import { UsageError } from './errors.js';

export function usage(flag: string, value: unknown, problem: string, fix: string): UsageError {
  // A flag that was not given has no value to quote.
  const what = value === undefined ? flag : `${flag} ${JSON.stringify(value)}:`;
  return new UsageError('E_USAGE', `${what} ${problem}; ${fix}`, { flag, value });
}

export function integer(flag: string, value: unknown, min: number, max: number, fix: string): number {
  const n = typeof value === 'string' && value.trim() !== '' ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < min || n > max) {
    throw usage(flag, value, `must be an integer from ${min} to ${max}`, fix);
  }
  return n;
}

/** A version number as weightd ctl list shows it (v0, v1, ...), with its v or without. */
export function versionNumber(flag: string, value: string | undefined): number {
  return integer(flag, value?.replace(/^v/, ''), 0, Number.MAX_SAFE_INTEGER, 'pass a version number as weightd ctl list shows it (v0, v1, ...)');
}

/**
 * A flag's number, scaled; a value that is not a number is passed on as it is, for the checks
 * that name the flag (resolveNodeOptions, the control schema) to refuse.
 */
export function num(value: string | undefined, scale = 1): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  return value.trim() !== '' && Number.isFinite(n) ? n * scale : (value as unknown as number);
}
