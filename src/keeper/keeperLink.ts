// The node's link to its keeper, on the main thread: find it (or, with --keeper spawn, start it)
// before the ranks load, watch it for the node's life, and when it dies find or start another
// and have every loaded rank keep its segments there again. The daemon holds every segment's
// descriptor itself while it runs, so a keeper's death loses nothing until the daemon dies too;
// what is lost meanwhile is only the survival of a daemon crash, and status says so.
import { closeSync, openSync, rmSync } from 'node:fs';
import type { Socket } from 'node:net';
import { dirname, join } from 'node:path';
import { errorCode } from '../errors.js';
import type { Logger } from '../log.js';
import type { KeeperStatus } from '../nodeStatus.js';
import { KeeperClient, startKeeper } from './keeperClient.js';
import { KEEPER_LOG_NAME } from './keeperSocketPath.js';
import { formatBytes } from '../inspect/loadProgress.js';

export interface KeeperLinkOptions {
  mode: 'spawn' | 'external';
  socket: string;
  /** For a keeper this node spawns: how long it holds segments nobody adopts. */
  adoptWithinS: number;
  log: Logger;
  /** A keeper answers again after one was lost or absent: the ranks keep their segments there. */
  onBack: () => void;
  /**
   * No keeper answered the start's first PING: the node loads rather than adopts, and can begin
   * what a load needs now, while a spawned keeper starts (tens of ms). Not called when a keeper
   * is looked for again later.
   */
  onNoneAtStart?: () => void;
}

/** How long the stop waits for the keeper to say what it holds. */
const HOLDING_TIMEOUT_MS = 1000;

/** How often an absent external keeper is looked for again (a spawned one is started at once). */
const RETRY_MS = 1000;

/** How long a refused start waits for the keeper it spawned to exit before it leaves that keeper's log. */
const REFUSED_EXIT_WAIT_MS = 5000;

/** The keeper's --log-level for the daemon's own level: the keeper knows debug, info, warn and error. */
export function keeperLogLevel(level: string): 'debug' | 'info' | 'warn' | 'error' {
  if (level === 'trace' || level === 'debug') return 'debug';
  if (level === 'info' || level === 'warn') return level;
  return 'error';
}

export class KeeperLink {
  readonly #o: KeeperLinkOptions;
  readonly #client: KeeperClient;
  #status: KeeperStatus;
  #watch?: Socket;
  #retry?: NodeJS.Timeout;
  #closed = false;
  /** The first find (or spawn) while it runs: close() waits for it. */
  #starting?: Promise<void>;
  /** The keeper this link spawned, and its log file when this link created it (none was there). */
  #spawned?: { exited: Promise<void>; createdLog?: string };

  constructor(o: KeeperLinkOptions) {
    this.#o = o;
    this.#client = new KeeperClient(o.socket);
    this.#status = { mode: o.mode, socket: o.socket, state: 'starting', since: Date.now(), reconnects: 0 };
  }

  get socket(): string {
    return this.#o.socket;
  }

  status(): KeeperStatus {
    return { ...this.#status };
  }

  /** Whether this link started the keeper (so it holds nothing of an earlier daemon). */
  get startedHere(): boolean {
    return this.#spawned !== undefined;
  }

  /** Finds (or starts) the keeper. Never throws: a node without its keeper still serves. */
  start(): Promise<void> {
    this.#starting = this.#connect(false);
    return this.#starting;
  }

  /**
   * The stop's word on what outlives it: the shards the keeper still holds for this daemon, their
   * bytes, and until when nobody adopting them keeps them. Quick and quiet: a keeper that does
   * not answer at once is left to its own log.
   */
  async logHolding(): Promise<void> {
    if (this.#status.state !== 'up') return;
    let records;
    try {
      records = await new KeeperClient(this.#o.socket, HOLDING_TIMEOUT_MS).list();
    } catch {
      return;
    }
    const own = records.filter((r) => r.ownerPid === process.pid);
    if (own.length === 0) return;
    // Only here: a daemon that keeps nothing never loads the record's schema.
    const { parseKeptRecord } = await import('./keptRecord.js');
    const bytes = own.reduce((n, r) => {
      const parsed = parseKeptRecord(r.record);
      return n + ('record' in parsed ? parsed.record.totalBytes : 0);
    }, 0);
    const { socket, mode, adoptWithinS } = this.#o;
    const freedAt = mode === 'spawn' ? new Date(Date.now() + adoptWithinS * 1000).toISOString() : undefined;
    const until = freedAt ? `until ${freedAt} (--adopt-within ${adoptWithinS} s)` : "for the keeper's own --adopt-within after this exit";
    this.#o.log.info(
      { keeper: socket, pid: this.#status.pid, shards: own.length, bytes, freedAt },
      `the keeper (pid ${this.#status.pid}) still holds ${own.length} shard${own.length === 1 ? '' : 's'} (${formatBytes(bytes)}) of this daemon ${until}, for the next daemon to adopt; weightd keeper stop --socket ${socket} frees them now`,
    );
  }

  /**
   * Stops watching the keeper. Resolves once a start in flight has settled: a keeper spawned for
   * a start that was then refused must get our WATCH and see it close, or it would wait the
   * whole adopt-within for a daemon that is gone (docs/keeper.md, --exit-when-empty).
   */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#retry);
    this.#watch?.destroy();
    await this.#starting;
  }

  /**
   * Closes the link of a node whose start was refused, leaving the socket directory as the start
   * found it: the keeper it spawned holds nothing and exits once our WATCH closes (removing its
   * socket), and the log file this start created for it is removed then. A keeper still running
   * after REFUSED_EXIT_WAIT_MS (another daemon of this socket took it up) keeps its log.
   */
  async closeRefusedStart(): Promise<void> {
    await this.close();
    const spawned = this.#spawned;
    if (spawned?.createdLog === undefined) return;
    let timer: NodeJS.Timeout | undefined;
    const exited = await Promise.race([spawned.exited.then(() => true), new Promise<boolean>((resolve) => (timer = setTimeout(resolve, REFUSED_EXIT_WAIT_MS, false)))]);
    clearTimeout(timer);
    if (exited) rmSync(spawned.createdLog, { force: true });
  }

  #set(state: KeeperStatus['state'], extra: Partial<KeeperStatus> = {}): void {
    this.#status = { ...this.#status, state, since: Date.now(), pid: undefined, reason: undefined, ...extra };
  }

  async #connect(again: boolean): Promise<void> {
    const { log, socket } = this.#o;
    let pid: number;
    try {
      pid = await this.#find(again);
    } catch (err) {
      const reason = (err as Error).message;
      if (this.#status.state !== 'absent') {
        log.warn({ keeper: socket, reason }, this.#o.mode === 'external' ? 'no keeper answers: ranks are not kept until one does (start weightd-keeper, or see docs/operations.md)' : 'could not start a keeper: ranks are not kept');
      }
      this.#set('absent', { reason });
      this.#later();
      return;
    }
    try {
      const watch = await this.#client.watch();
      if (this.#closed) {
        watch.destroy();
        return;
      }
      // watch() resolves after a PING: a keeper that ended meanwhile closed it before this
      // listener was there, and its 'close' has come and gone.
      if (watch.destroyed) throw new Error('the keeper closed our WATCH connection as it was taken');
      this.#watch = watch;
      watch.on('close', () => this.#lost());
      watch.on('error', () => {});
    } catch (err) {
      const reason = (err as Error).message;
      // E_TOO_MANY_WATCHERS: the keeper lives, and what the ranks kept stays kept, but this node
      // would not see it end and keep there again. Said once, not at every retry.
      if (this.#status.state !== 'absent' || this.#status.reason !== reason) {
        log.warn({ keeper: socket, code: errorCode(err), reason }, 'could not watch the keeper: every shard stays served, but this node would not see the keeper end and keep its shards again; asking again every second');
      }
      this.#set('absent', { reason });
      this.#later();
      return;
    }
    this.#set('up', { pid, reconnects: this.#status.reconnects + (again ? 1 : 0) });
    log.info({ keeper: socket, pid }, again ? 'a keeper answers again: the ranks keep their shards there' : 'keeping the ranks\' shards in the keeper');
    if (again) this.#o.onBack();
  }

  /** The pid of a keeper answering at the socket; with spawn, one this call starts if none does. */
  async #find(again: boolean): Promise<number> {
    try {
      return (await this.#client.ping()).pid;
    } catch (err) {
      if (!again) this.#o.onNoneAtStart?.();
      if (this.#o.mode !== 'spawn') throw err;
    }
    // Its log goes to a file beside its socket: inheriting the daemon's stderr would hold the
    // daemon's pipe open (a supervisor's, a test's) long after the daemon is gone.
    const logFile = join(dirname(this.#o.socket), KEEPER_LOG_NAME);
    const { fd: stderr, created } = openLog(logFile);
    try {
      const started = await startKeeper({ socket: this.#o.socket, adoptWithinS: this.#o.adoptWithinS, logLevel: keeperLogLevel(this.#o.log.level), stderr });
      if (started.spawned) {
        this.#spawned = { exited: started.exited, ...(created ? { createdLog: logFile } : {}) };
        this.#o.log.info({ keeper: this.#o.socket, pid: started.ping.pid, adoptWithinS: this.#o.adoptWithinS, log: logFile }, 'started a keeper');
      }
      return started.ping.pid;
    } finally {
      closeSync(stderr);
    }
  }

  #lost(): void {
    this.#watch = undefined;
    if (this.#closed) return;
    this.#o.log.warn({ keeper: this.#o.socket, pid: this.#status.pid }, 'the keeper ended: every shard stays served, but none survives a daemon restart until a keeper holds it again');
    this.#set('lost');
    void this.#connect(true);
  }

  #later(): void {
    if (this.#closed) return;
    clearTimeout(this.#retry);
    this.#retry = setTimeout(() => void this.#connect(true), RETRY_MS);
    // Looking for a keeper never keeps the process alive.
    this.#retry.unref();
  }
}

/** Opens the keeper's log for appending; `created` when this call made the file. */
function openLog(path: string): { fd: number; created: boolean } {
  try {
    return { fd: openSync(path, 'ax', 0o600), created: true };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    return { fd: openSync(path, 'a', 0o600), created: false };
  }
}
