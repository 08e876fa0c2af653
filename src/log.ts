// What every command logs with: the levels, the flush a READY line waits for, and the command
// line's own errors. The node's logger is createLogger.ts's, which only a node loads.
import { writeSync } from 'node:fs';
import type { Logger } from 'pino';

export type { Logger };

export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'] as const;

/** Resolves once every line logged so far has been written. */
export function flushLogger(log: Logger): Promise<void> {
  return new Promise((resolve) => log.flush(() => resolve()));
}

/**
 * A message of the command line itself (a bad flag, a failure before the node's logger exists):
 * `weightd: ...` on a terminal, and otherwise a JSON line shaped like the logger's, so that
 * every line a log shipper or `jq` reads from stderr parses.
 */
export function writeCliError(message: string, fields: Record<string, unknown> = {}, tty = Boolean(process.stderr.isTTY)): void {
  const line = tty ? `weightd: ${message}` : JSON.stringify({ level: 50, time: Date.now(), pid: process.pid, ...fields, msg: message });
  writeSync(2, `${line}\n`);
}
