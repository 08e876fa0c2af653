// The node's control socket: `<socket dir>/control-<pid>.sock`, mode 0600 in the 0700 socket
// directory, served to peers of this uid only (SO_PEERCRED, as the device sockets), never over
// TCP. It wires the parts, as the device server does: the listener (socketListener.ts) hands it
// each new socket, admission (peerAdmission.ts) decides whether it is served, a ControlConnection
// reads its one request and writes its one reply, and the request goes to its command's handler
// (handlers/) within a rate limit shared by every connection, since every peer is the same user.
// One over the connection cap is told so in a frame (E_TOO_MANY_CONNECTIONS) and closed, so idle
// peers cannot lock `ctl` out.
import type { Socket } from 'node:net';
import { ProtocolError, schemaIssues, WeightdError } from '../errors.js';
import type { Logger } from '../log.js';
import { encodeFrame, parsePayload } from '../wire/frameCodec.js';
import { LogLimiter } from '../wire/logLimiter.js';
import { descriptorBudget, type ListenerShare } from '../wire/descriptorBudget.js';
import { admitPeer } from '../wire/peerAdmission.js';
import { turnAway } from '../wire/turnAway.js';
import { resolveSocketDir } from '../wire/socketDir.js';
import { SocketListener } from '../wire/socketListener.js';
import { ControlConnection, refusal } from './controlConnection.js';
import { ControlRequest, DEFAULT_CONTROL_LIMITS, type ControlLimits, type ControlReply } from './controlProtocol.js';
import { controlSocketName } from './controlSocket.js';
import type { ControlTarget } from './controlTarget.js';
import { dispatchControl } from './handlers/index.js';
import { removeStaleControlFiles } from './staleControlFiles.js';
import { TokenBucket } from './tokenBucket.js';

export class ControlServer {
  readonly #listener: SocketListener;
  readonly #log: Logger;
  readonly #target: ControlTarget;
  readonly #limits: ControlLimits;
  readonly #bucket: TokenBucket;
  readonly #connections = new Set<ControlConnection>();
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
    for (const c of this.#connections) c.destroy();
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
        const why = new WeightdError('E_TOO_MANY_CONNECTIONS', `the control socket holds ${this.#limits.maxConnections} connections, its most, and refused this one; try again once they are answered (an idle one is closed after ${this.#limits.readTimeoutMs} ms)`, { limit: this.#limits.maxConnections });
        turnAway(socket, encodeFrame(JSON.stringify(refusal(why))));
      } else {
        socket.destroy();
      }
      return;
    }
    const connection = new ControlConnection(
      socket,
      this.#limits.readTimeoutMs,
      (payload) => this.#serve(payload, admission.pid),
      () => this.#connections.delete(connection),
    );
    this.#connections.add(connection);
  }

  async #serve(payload: Buffer, pid: number): Promise<ControlReply> {
    try {
      if (!this.#bucket.take()) {
        throw new WeightdError('E_RATE_LIMITED', `more than ${this.#limits.burst} control requests at once (then ${this.#limits.perSecond} a second): this one was refused; wait a moment and send it again`);
      }
      const parsed = ControlRequest.safeParse(parsePayload(payload));
      if (!parsed.success) throw new ProtocolError('E_BAD_REQUEST', `control request does not match the schema: ${schemaIssues(parsed.error.issues)}`);
      const req = parsed.data;
      this.#log.info({ peerPid: pid, cmd: req.cmd, ...(req.cmd === 'list' ? {} : req) }, 'control request');
      return await dispatchControl(req, this.#target);
    } catch (err) {
      return refusal(err);
    }
  }
}
