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
