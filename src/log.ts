// One pino logger per node. JSON on stderr by default (for journald and log shippers); a
// readable form when stderr is a terminal. Both write synchronously, so a line printed after
// a flush (the READY line) really comes after every earlier log line.
import { writeSync } from 'node:fs';
import { createRequire } from 'node:module';
import type { Logger, LevelWithSilent } from 'pino';
import type pretty from 'pino-pretty';

export type { Logger };

/** pino and pino-pretty are CommonJS: required when the first logger is made, not at import. */
const require = createRequire(import.meta.url);

export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'] as const;

export interface LoggerOptions {
  level?: LevelWithSilent;
  nodeRank: number;
  /** Force the readable form on or off; default: on when stderr is a TTY. */
  pretty?: boolean;
  /** Where lines go; default stderr. */
  destination?: NodeJS.WritableStream;
}

export function createLogger(opts: LoggerOptions): Logger {
  // Loaded with the first logger: the commands that only print (--version, --help, ctl) or
  // write a CLI error need none.
  const pino = require('pino') as typeof import('pino');
  const base = {
    level: opts.level ?? 'info',
    base: { nodeRank: opts.nodeRank },
    // Milliseconds since this process started, on every line: each phase's line (planned,
    // loaded, READY) says how long start-up took to reach it, on the clock an operator waits by.
    mixin: () => ({ sinceStartMs: Math.round(performance.now()) }),
  };
  const usePretty = opts.pretty ?? Boolean(process.stderr.isTTY);
  if (opts.destination) return pino(base, opts.destination);
  if (usePretty) {
    // Loaded only for a terminal: a daemon logging JSON (a service, a launcher) never needs it.
    const prettyStream = require('pino-pretty') as typeof pretty;
    return pino(base, prettyStream({ destination: 2, sync: true, colorize: true, ignore: 'pid,hostname', translateTime: 'HH:MM:ss.l' }));
  }
  return pino(base, pino.destination({ dest: 2, sync: true }));
}

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
