// The node's control socket: `<socket dir>/control-<pid>.sock`, mode 0600 in the 0700 socket
// directory, served to peers of this uid only (SO_PEERCRED, as the device sockets), never over
// TCP. Each connection carries one bounded request (load, unload, list), answered in one frame,
// within a rate limit shared by every connection, since every peer is the same user.
import { lstatSync, readdirSync, unlinkSync } from 'node:fs';
import type { Socket } from 'node:net';
import { join } from 'node:path';
import { ProtocolError, WeightdError } from '../errors.js';
import type { Logger } from '../log.js';
import type { EvictionPolicy } from '../evictionPolicy.js';
import type { LoadResult, ModelStatus, UnloadResult } from '../nodeStatus.js';
import { encodeFrame, FrameDecoder, parsePayload } from '../serve/frameCodec.js';
import { LogLimiter } from '../serve/logLimiter.js';
import { admitPeer } from '../serve/peerAdmission.js';
import { isProcessAlive, processIdentity } from '../serve/processLiveness.js';
import { resolveSocketDir } from '../serve/socketDir.js';
import { SocketListener } from '../serve/socketListener.js';
import type { ModelRequest } from '../modelSpecs.js';
import { CONTROL_FILE, ControlRequest, controlSocketName, DEFAULT_CONTROL_LIMITS, MAX_CONTROL_REQUEST_BYTES, type ControlLimits, type ControlReply } from './controlProtocol.js';
import { TokenBucket } from './tokenBucket.js';

/** What the control socket drives: the node's programmatic API. */
export interface ControlTarget {
  load(request: ModelRequest, options: { evict?: EvictionPolicy }): Promise<LoadResult>;
  unload(target: string, options: { force?: boolean }): UnloadResult | Promise<UnloadResult>;
  models(): ModelStatus[];
}

export class ControlServer {
  readonly #listener: SocketListener;
  readonly #log: Logger;
  readonly #target: ControlTarget;
  readonly #limits: ControlLimits;
  readonly #bucket: TokenBucket;
  readonly #sockets = new Set<Socket>();
  readonly #uid = process.getuid!();
  readonly #peerLog: LogLimiter;
  readonly #socketDir: string | undefined;
  #path: string | undefined;

  constructor(options: { socketDir?: string; log: Logger; target: ControlTarget; limits?: Partial<ControlLimits> }) {
    this.#socketDir = options.socketDir;
    this.#log = options.log;
    this.#target = options.target;
    this.#limits = { ...DEFAULT_CONTROL_LIMITS, ...options.limits };
    this.#bucket = new TokenBucket(this.#limits.burst, this.#limits.perSecond);
    this.#listener = new SocketListener({ name: controlSocketName(), socketDir: options.socketDir, log: options.log });
    this.#peerLog = new LogLimiter(20, 10_000, (dropped) => this.#log.warn({ dropped }, `${dropped} more refused control requests were not logged`));
  }

  get path(): string | undefined {
    return this.#path;
  }

  async listen(): Promise<string> {
    try {
      removeStaleControlFiles(resolveSocketDir(this.#socketDir), this.#log);
      this.#path = await this.#listener.listen((socket) => this.#onConnection(socket));
      this.#log.info({ socket: this.#path }, 'control socket');
      return this.#path;
    } catch (err) {
      this.close();
      throw err;
    }
  }

  close(): void {
    this.#peerLog.flush();
    for (const s of this.#sockets) s.destroy();
    this.#listener.close();
  }

  #onConnection(socket: Socket): void {
    const admission = admitPeer(socket, { uid: this.#uid, openConnections: this.#sockets.size, maxConnections: this.#limits.maxConnections });
    if (!admission.admitted) {
      this.#peerLog.allow(() => this.#log.warn({ ...admission.fields, socket: this.#path }, `control socket: ${admission.message}`));
      socket.destroy();
      return;
    }
    this.#sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => {
      clearTimeout(timer);
      this.#sockets.delete(socket);
    });
    const timer = setTimeout(() => this.#reply(socket, refusal(new ProtocolError('E_READ_TIMEOUT', `no complete control request within ${this.#limits.readTimeoutMs} ms`))), this.#limits.readTimeoutMs);
    const decoder = new FrameDecoder(MAX_CONTROL_REQUEST_BYTES);
    const onData = (chunk: Buffer) => {
      let frames: Buffer[];
      try {
        frames = decoder.push(chunk);
      } catch (err) {
        frames = [];
        socket.off('data', onData);
        clearTimeout(timer);
        this.#reply(socket, refusal(err));
        return;
      }
      if (frames.length === 0) return;
      socket.off('data', onData);
      clearTimeout(timer);
      void this.#serve(frames[0]!, admission.pid).then((reply) => this.#reply(socket, reply));
    };
    socket.on('data', onData);
  }

  async #serve(payload: Buffer, pid: number): Promise<ControlReply> {
    try {
      if (!this.#bucket.take()) {
        throw new WeightdError('E_RATE_LIMITED', `more than ${this.#limits.burst} control requests at once (then ${this.#limits.perSecond} a second): this one was refused; wait a moment and send it again`);
      }
      const parsed = ControlRequest.safeParse(parsePayload(payload));
      if (!parsed.success) {
        const issues = parsed.error.issues.slice(0, 5).map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
        throw new ProtocolError('E_BAD_REQUEST', `control request does not match the schema: ${issues}`);
      }
      const req = parsed.data;
      this.#log.info({ peerPid: pid, cmd: req.cmd, ...(req.cmd === 'list' ? {} : req) }, 'control request');
      switch (req.cmd) {
        case 'load': {
          const { cmd: _cmd, evict, ...request } = req;
          return { ok: true, ...(await this.#target.load(request, { evict })) };
        }
        case 'unload':
          return { ok: true, ...(await this.#target.unload(req.target, { force: req.force })) };
        case 'list':
          return { ok: true, models: this.#target.models() };
      }
    } catch (err) {
      return refusal(err);
    }
  }

  #reply(socket: Socket, reply: ControlReply): void {
    if (!socket.destroyed) socket.end(encodeFrame(JSON.stringify(reply)));
  }
}

/**
 * The control files of daemons that no longer run (killed with SIGKILL: nothing removed them).
 * Each daemon's files have its pid in their names, so a live one's are never touched.
 */
function removeStaleControlFiles(dir: string, log: Logger): void {
  const uid = process.getuid!();
  for (const name of readdirSync(dir)) {
    const pid = Number(CONTROL_FILE.exec(name)?.[1] ?? 0);
    if (pid <= 0 || pid === process.pid || isProcessAlive(processIdentity(pid))) continue;
    const path = join(dir, name);
    try {
      if (lstatSync(path).uid !== uid) continue;
      unlinkSync(path);
      log.warn({ path, deadPid: pid }, 'removed the control file of a weightd that no longer runs');
    } catch {
      // Gone meanwhile: another daemon starting in this directory removed it first.
    }
  }
}

function refusal(err: unknown): ControlReply {
  const e = err instanceof WeightdError ? err : new WeightdError('E_INTERNAL', `internal error: ${(err as Error).message}`);
  return { ok: false, error: { code: e.code, message: e.message, ...(Object.keys(e.details).length > 0 ? { details: e.details } : {}) } };
}
