// The node's control socket: `<socket dir>/control-<pid>.sock`, mode 0600 in the 0700 socket
// directory, served to peers of this uid only (SO_PEERCRED, as the device sockets), never over
// TCP. Each connection carries one bounded request (load, unload, list), answered in one frame,
// within a rate limit shared by every connection, since every peer is the same user. A
// connection never outstays its business: one that sends no complete request within the read
// deadline, or does not take its reply, is closed (its descriptor too), and one over the cap is
// told so in a frame (E_TOO_MANY_CONNECTIONS) and closed, so idle peers cannot lock `ctl` out.
import { lstatSync, readdirSync, unlinkSync } from 'node:fs';
import type { Socket } from 'node:net';
import { join } from 'node:path';
import { ProtocolError, WeightdError } from '../errors.js';
import type { Logger } from '../log.js';
import type { EvictionPolicy } from '../models/evictionPolicy.js';
import type { LoadResult, ModelStatus, UnloadResult } from '../nodeStatus.js';
import { encodeFrame, FrameDecoder, parsePayload } from '../wire/frameCodec.js';
import { LogLimiter } from '../wire/logLimiter.js';
import { descriptorBudget, type ListenerShare } from '../wire/descriptorBudget.js';
import { admitPeer } from '../wire/peerAdmission.js';
import { isProcessAlive, processIdentity } from '../wire/processLiveness.js';
import { resolveSocketDir } from '../wire/socketDir.js';
import { SocketListener } from '../wire/socketListener.js';
import type { ModelRequest } from '../models/modelSpecs.js';
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
  #share: ListenerShare | undefined;

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
      // Every connection it may hold is set aside for it: no flood elsewhere keeps `ctl` out.
      const cap = this.#limits.maxConnections;
      this.#share = descriptorBudget().share({ name: 'control socket', cap, guaranteed: cap, trusted: true });
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
    this.#share?.close();
    this.#share = undefined;
  }

  #onConnection(socket: Socket): void {
    if (!this.#share) {
      socket.destroy();
      return;
    }
    socket.on('error', () => {});
    const admission = admitPeer(socket, { uid: this.#uid, share: this.#share });
    if (!admission.admitted) {
      this.#peerLog.allow(() => this.#log.warn({ ...admission.fields, socket: this.#path }, `control socket: ${admission.message}`));
      // Another user learns nothing; our own is told why, and may try again.
      if (admission.full) {
        this.#turnAway(socket, new WeightdError('E_TOO_MANY_CONNECTIONS', `the control socket holds ${this.#limits.maxConnections} connections, its most, and refused this one; try again once they are answered (an idle one is closed after ${this.#limits.readTimeoutMs} ms)`, { limit: this.#limits.maxConnections }));
      } else {
        socket.destroy();
      }
      return;
    }
    this.#sockets.add(socket);
    socket.on('close', () => {
      clearTimeout(timer);
      this.#sockets.delete(socket);
    });
    const timer = setTimeout(() => this.#turnAway(socket, new ProtocolError('E_READ_TIMEOUT', `no complete control request within ${this.#limits.readTimeoutMs} ms`)), this.#limits.readTimeoutMs);
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

  /**
   * The connection's one reply. The socket is closed once it is written (end() alone would wait
   * for the peer to close its side too), or when the peer reads none of it for as long as a
   * request may take to arrive.
   */
  #reply(socket: Socket, reply: ControlReply): void {
    if (socket.destroyed) return;
    socket.setTimeout(this.#limits.readTimeoutMs, () => socket.destroy());
    socket.end(encodeFrame(JSON.stringify(reply)), () => socket.destroy());
  }

  /**
   * A connection the server is done waiting for: the refusal is written (a small frame on an
   * unwritten socket goes to the kernel at once) and the descriptor closed now, not once the
   * peer closes its side, which an idle peer never does.
   */
  #turnAway(socket: Socket, err: WeightdError): void {
    if (socket.destroyed) return;
    socket.write(encodeFrame(JSON.stringify(refusal(err))));
    socket.destroy();
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
