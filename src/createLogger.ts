// One pino logger per node. JSON on stderr by default (for journald and log shippers); a
// readable form when stderr is a terminal. Both write synchronously, so a line printed after
// a flush (the READY line) really comes after every earlier log line.
// Only a node imports this module (startNode.ts), so the commands that only print (--version,
// --help, ctl) or write a CLI error load no pino. pino is imported, not required on first use,
// so that the bundle (scripts/bundle-main.mjs) holds it and the launcher's code cache covers it:
// required from node_modules it was compiled at every start (~17 ms of the VM's start).
import { createRequire } from 'node:module';
import { pino, type LevelWithSilent, type Logger } from 'pino';
import type pretty from 'pino-pretty';

/** pino-pretty is CommonJS: required with the first logger that writes the readable form. */
const require = createRequire(import.meta.url);

export interface LoggerOptions {
  level?: LevelWithSilent;
  nodeRank: number;
  /** Force the readable form on or off; default: on when stderr is a TTY. */
  pretty?: boolean;
  /** Where lines go; default stderr. */
  destination?: NodeJS.WritableStream;
}

export function createLogger(opts: LoggerOptions): Logger {
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
