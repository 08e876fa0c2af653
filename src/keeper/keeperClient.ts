// Talking to weightd-keeper (docs/keeper.md): one request per connection through the addon's
// unixRequest (the only native fd transport), a WATCH connection held open to learn of the
// keeper's death, and startKeeper, which spawns one in its own session.
import { spawn, type StdioOptions } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { errorCode, KeeperError, ProtocolError } from '../errors.js';
import { addon } from '../native/addon.js';
import {
  decodeDrop,
  decodeEmpty,
  decodeList,
  decodePing,
  decodeTake,
  encodeDrop,
  encodeKeep,
  encodeList,
  encodePing,
  encodeTake,
  encodeWatch,
  KEEPER_MAX_REPLY_BYTES,
  type KeeperPing,
  type KeptRecord,
  type TakenRecord,
} from './keeperProtocol.js';

/** Built by `npm run build:native` next to the addon (CMakeLists.txt), found the way src/native/addon.ts finds it. */
export const keeperBinaryPath = fileURLToPath(new URL('../../../build/Release/weightd-keeper', import.meta.url));

/**
 * A LIST of every record the keeper holds, which the keeper keeps within this (E_KEEPER_FULL): at
 * 35 bytes a tensor of digests, 8 ranks of a 200,000-tensor checkpoint are 56 MB, plus one packed
 * plan; every other reply is far smaller.
 */
const MAX_REPLY_BYTES = KEEPER_MAX_REPLY_BYTES;
const DEFAULT_TIMEOUT_MS = 5000;

export class KeeperClient {
  constructor(
    readonly socketPath: string,
    readonly timeoutMs = DEFAULT_TIMEOUT_MS,
  ) {}

  /** One request; `decode` runs on the reply, and the reply's fds are closed if it throws. */
  async #request<T>(frame: Buffer, fds: number[], decode: (reply: Buffer) => T): Promise<{ value: T; fds: number[] }> {
    const reply = await addon().unixRequest(this.socketPath, frame, fds, this.timeoutMs, MAX_REPLY_BYTES);
    try {
      return { value: decode(reply.frame), fds: reply.fds };
    } catch (err) {
      for (const fd of reply.fds) addon().closeFd(fd);
      throw err;
    }
  }

  /** Hands `fds` (which the caller keeps) and `record` to the keeper under (device, fingerprint); replaces a record of that key. */
  async keep(device: string, fingerprint: string, record: Buffer, fds: number[]): Promise<void> {
    await this.#request(encodeKeep(device, fingerprint, record), fds, decodeEmpty);
  }

  /** The record and fresh fds of its memory (the caller's to close); this process becomes its owner. E_NOT_KEPT names what is kept. */
  async take(device: string, fingerprint: string): Promise<TakenRecord & { fds: number[] }> {
    const { value, fds } = await this.#request(encodeTake(device, fingerprint), [], decodeTake);
    return { ...value, fds };
  }

  /** fingerprint "" drops every record of `device`, device "" every record. Returns how many went. */
  async drop(device: string, fingerprint = ''): Promise<number> {
    return (await this.#request(encodeDrop(device, fingerprint), [], decodeDrop)).value;
  }

  async list(): Promise<KeptRecord[]> {
    return (await this.#request(encodeList(), [], decodeList)).value;
  }

  async ping(): Promise<KeeperPing> {
    return (await this.#request(encodePing(), [], decodePing)).value;
  }

  /**
   * A connection the keeper never answers and never closes: its 'close' event is the keeper's
   * death. The caller destroys it when done. Resolves once the keeper took it; a keeper that
   * already has its most watchers refuses it (KeeperError E_TOO_MANY_WATCHERS). WATCH has no
   * reply, but the keeper serves a WATCH before any request of a connection opened after it was
   * sent (docs/spec/keeper-wire.md §3): once a PING sent after it is answered, a refusal is
   * already in this socket, and this loop's turn reads it.
   */
  async watch(): Promise<Socket> {
    const socket = await new Promise<Socket>((resolve, reject) => {
      const s = connect(this.socketPath);
      s.once('error', reject);
      s.once('connect', () => s.write(encodeWatch(), (err) => (err ? reject(err) : resolve(s))));
    });
    const refusal: Buffer[] = [];
    const onData = (b: Buffer) => refusal.push(b);
    socket.on('data', onData);
    socket.on('error', () => {});
    try {
      await this.ping();
      await new Promise((r) => setImmediate(r));
      if (refusal.length > 0) {
        decodeEmpty(Buffer.concat(refusal));
        throw new ProtocolError('E_KEEPER_REPLY', 'the keeper answered a WATCH, which has no reply: the socket is not a weightd keeper\'s');
      }
    } catch (err) {
      socket.destroy();
      throw err;
    }
    socket.off('data', onData);
    return socket;
  }
}

export interface StartKeeperOptions {
  socket: string;
  /** Seconds a record outlives its owner before it is freed (the keeper's default: 600). */
  adoptWithinS?: number;
  /** Default true: the keeper exits once it holds nothing and nobody is connected. */
  exitWhenEmpty?: boolean;
  logLevel?: 'debug' | 'info' | 'warn' | 'error';
  /** Where the keeper's JSON log lines go; default 'inherit' (the daemon's own stderr). */
  stderr?: 'inherit' | 'ignore' | number;
  /** How long to wait for its first PING answer; default 10 s. */
  readyTimeoutMs?: number;
  binary?: string;
}

export type StartedKeeper =
  | { ping: KeeperPing; spawned: true; /** Settles when the keeper this call spawned exits. */ exited: Promise<void> }
  /** A keeper already served the socket (the new one exited 3): this is that one. */
  | { ping: KeeperPing; spawned: false };

/**
 * Spawns weightd-keeper detached, in a session of its own (so a signal to the daemon's process
 * group does not reach it), and resolves once it answers PING. A keeper already serving the
 * socket is used instead.
 */
export async function startKeeper(options: StartKeeperOptions): Promise<StartedKeeper> {
  const binary = options.binary ?? keeperBinaryPath;
  try {
    accessSync(binary, constants.X_OK);
  } catch (err) {
    throw new KeeperError('E_KEEPER_NOT_FOUND', `the keeper binary ${binary} is missing or not executable: build it with "npm run build:native"`, { binary }, { cause: err });
  }
  const args = ['--socket', options.socket];
  if (options.adoptWithinS !== undefined) args.push('--adopt-within', String(options.adoptWithinS));
  if (options.exitWhenEmpty ?? true) args.push('--exit-when-empty');
  if (options.logLevel) args.push('--log-level', options.logLevel);
  const stdio: StdioOptions = ['ignore', 'ignore', options.stderr ?? 'inherit'];
  const child = spawn(binary, args, { detached: true, stdio });
  let exited: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  let spawnError: Error | undefined;
  const exit = new Promise<void>((resolve) => child.on('exit', (code, signal) => ((exited = { code, signal }), resolve())));
  child.on('error', (err) => (spawnError = err));
  child.unref();

  const client = new KeeperClient(options.socket, 1000);
  const deadline = Date.now() + (options.readyTimeoutMs ?? 10_000);
  for (;;) {
    if (spawnError) throw new KeeperError('E_KEEPER_START', `cannot start ${binary}: ${spawnError.message}`, { binary }, { cause: spawnError });
    // Exit 3: another keeper serves the socket; it is asked below like ours would have been.
    if (exited && exited.code !== 3) {
      throw new KeeperError('E_KEEPER_START', `the keeper exited ${exited.signal ?? `with code ${exited.code}`} before serving ${options.socket}; its stderr says why`, { socket: options.socket, ...exited });
    }
    try {
      const ping = await client.ping();
      if (ping.pid === child.pid) return { ping, spawned: true, exited: exit };
      // Another keeper answers: ours is still deciding, and would serve if that one went away
      // before it looked. Only its exit 3 makes the other one the answer.
      if (exited) return { ping, spawned: false };
    } catch (err) {
      // Not there yet (ENOENT) or not listening yet (ECONNREFUSED): the keeper is starting.
      if (errorCode(err) !== 'E_CONNECT') throw err;
    }
    if (Date.now() > deadline) {
      if (!exited) child.kill('SIGKILL');
      throw new KeeperError('E_KEEPER_START', `the keeper did not answer on ${options.socket} within ${options.readyTimeoutMs ?? 10_000} ms`, { socket: options.socket });
    }
    // Polling for the socket to appear: the keeper has no other way to say it listens.
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
