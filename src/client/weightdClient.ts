// The TypeScript client of a rank's socket: one connection, one request at a time. Replies are
// schema-checked; error replies become ServeError with the daemon's code. The daemon closes idle
// connections (only ever between requests), so a connection found closed is reopened, and a
// request that meets such a close before any reply byte is sent once more on a new connection:
// the daemon never read it, so it cannot be applied twice. A client may hold a lease for hours
// and still detach.
import { connect, type Socket } from 'node:net';
import type { z } from 'zod';
import { ProtocolError, receivedCode, ServeError } from '../errors.js';
import { addon } from '../native/addon.js';
import { encodeMessage, FRAME_HEADER_BYTES, FrameDecoder, MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES, parsePayload } from '../wire/frameCodec.js';
import {
  ErrorReply,
  ModelEvent,
  REPLY_SCHEMAS,
  type Command,
  type DetachReply,
  type GetStateReply,
  type MismatchReply,
  type PingReply,
  type ReleaseReply,
  type ServeMode,
  type StateReply,
  type StatsReply,
  type WatchReply,
} from '../wire/protocol.js';
import { fromPacked } from '../wire/packedManifest.js';
import { fromColumns } from '../wire/tensorColumns.js';
import { CUDA_FD_HANDLE, openCuda, openHost, type DeviceTensor, type HostTensor } from './segmentAccess.js';

export interface ClientOptions {
  /** Per request, from sending to the complete reply. Default 30 s. */
  timeoutMs?: number;
  /** Sent with get_state, for the daemon's logs. */
  clientName?: string;
}

/** What the client expects the cache to hold: the fingerprint (and, optionally, its fields). */
export interface Expected {
  fingerprint: string;
  fingerprintFields?: Record<string, string>;
}

/** A zero-copy attachment; its memory stays valid until `detach()` (or process exit). */
export type Attached = {
  status: 'attached';
  state: StateReply;
  leaseId: string;
  /**
   * Unmaps (closes the IPC handles) and drops the lease. Idempotent. Resolves with the leases the
   * daemon dropped: 1, or 0 when the lease had already ended (revoked by a forced unload or release).
   */
  detach(): Promise<number>;
} & ({ backend: 'host'; tensors: Record<string, HostTensor> } | { backend: 'cuda'; tensors: Record<string, DeviceTensor> });

/** Tensors copied into this process's memory; the daemon holds nothing for this client after. */
export interface Copied {
  status: 'copied';
  state: StateReply;
  tensors: Record<string, HostTensor>;
}

export interface AttachOptions {
  /** cuda: this process's device index for the daemon's device. Default: the daemon's index. */
  deviceIndex?: number;
  /** Whose names and shapes the tensors come under, e.g. `vllm` (docs/protocol.md, Layouts). Default `checkpoint`. */
  layout?: string;
}

type Reply<C extends Command> = z.infer<(typeof REPLY_SCHEMAS)[C]>;

interface Waiting {
  id: number;
  /** The connection the request went out on: only it can answer or fail it. */
  socket: Socket;
  resolve: (value: unknown) => void;
  reject: (err: Error) => void;
}

/** The connection ended before any byte of the reply arrived. */
class ClosedBeforeReply extends ServeError {}

export class WeightdClient {
  readonly socketPath: string;
  readonly #timeoutMs: number;
  readonly #clientName: string;
  #socket: Socket | undefined;
  #decoder = new FrameDecoder(MAX_RESPONSE_BYTES);
  #waiting: Waiting | undefined;
  #nextId = 1;
  /** Whether any byte of the current reply arrived. */
  #replyStarted = false;
  /**
   * An error reply (id null) that came while nothing was asked: a refusal the daemon sends as it
   * closes a connection it will not serve (its connection cap). It is the reply to the next
   * request, as the Python client reads it; dropped, that request would go out on a new
   * connection and the reason would be lost.
   */
  #refusal: unknown;
  /** A get_state reply whose packed manifest, the next frame, is still to come. */
  #awaitingPacked: { value: { packed: number | Uint8Array } } | undefined;
  /** Serializes requests: the protocol answers in order, one at a time. */
  #chain: Promise<unknown> = Promise.resolve();
  readonly #eventListeners = new Set<(event: ModelEvent) => void>();

  private constructor(socketPath: string, options: ClientOptions) {
    this.socketPath = socketPath;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#clientName = options.clientName ?? `weightd-ts/${process.pid}`;
  }

  /** Connects (and checks the daemon runs as this user). */
  static async connect(socketPath: string, options: ClientOptions = {}): Promise<WeightdClient> {
    const client = new WeightdClient(socketPath, options);
    await client.#open();
    return client;
  }

  ping(): Promise<PingReply> {
    return this.#request('ping', {});
  }

  /** get_state as sent on the wire: a mismatch reply, or the manifest with a lease. */
  async getState(expected: Expected, mode: ServeMode, layout = 'checkpoint'): Promise<GetStateReply> {
    const reply = await this.#request('get_state', { ...expected, mode, pid: process.pid, client: this.#clientName, packed: true, columns: true, ...(layout === 'checkpoint' ? {} : { layout }) }).catch(async (err: unknown) => {
      // A reply whose packed manifest was refused came with a lease: a map lease follows this
      // process, so it would hold the version's memory until the process exits.
      const leaseId = err instanceof ProtocolError ? err.details.leaseId : undefined;
      if (typeof leaseId === 'string') await this.detach(leaseId).catch(() => {});
      throw err;
    });
    if (reply.status === 'mismatch') return reply;
    // A daemon older than layouts ignores the field and answers with checkpoint names.
    if ((reply.layout ?? 'checkpoint') !== layout) {
      await this.detach(reply.leaseId).catch(() => {});
      throw new ProtocolError('E_LAYOUT_NOT_SERVED', `asked for layout "${layout}" but the daemon answered with "${reply.layout ?? 'checkpoint'}" (a weightd older than layouts); upgrade the daemon, or load from disk`, { layout });
    }
    // A daemon older than packing sends columns, and one older than columns objects.
    const { packed, columns, tensors, ...rest } = reply;
    try {
      return { ...rest, tensors: tensors ?? (packed instanceof Uint8Array ? fromPacked(Buffer.from(packed.buffer, packed.byteOffset, packed.length)) : fromColumns(columns!)) };
    } catch (err) {
      await this.detach(reply.leaseId).catch(() => {});
      throw err;
    }
  }

  /**
   * What the daemon proved of this rank's content while it filled it: its full-content
   * fingerprint and every checkpoint tensor's digest (docs/spec/fingerprint.md §8). Undefined
   * from a daemon that has none (older than digests, or serving a keeper's record without them).
   * Asks for the version of rank fingerprint `fingerprint` (not the one ping names: a socket
   * serves several models), under a copy lease that it drops at once; the mismatch reply when
   * the daemon serves no such version.
   */
  async contentDigests(fingerprint: string): Promise<{ fingerprint: string; digests: Record<string, string> } | MismatchReply | undefined> {
    const reply = await this.#request('get_state', { fingerprint, mode: 'copy', pid: process.pid, client: this.#clientName, columns: true, digests: true });
    if (reply.status === 'mismatch') return reply;
    await this.detach(reply.leaseId);
    return reply.content;
  }

  /**
   * Maps the rank's memory zero-copy (mode "map") and returns a view per tensor and alias, or
   * the mismatch reply when the cache holds something else (then load from disk).
   */
  async attach(expected: Expected, options: AttachOptions = {}): Promise<Attached | MismatchReply> {
    const state = await this.getState(expected, 'map', options.layout);
    if (state.status === 'mismatch') return state;
    let detached = false;
    let unmap = () => {};
    const detach = async () => {
      if (detached) return 0;
      detached = true;
      unmap();
      return this.detach(state.leaseId);
    };
    const base = { status: 'attached' as const, state, leaseId: state.leaseId, detach };
    try {
      if (state.backend === 'host') {
        const host = openHost(state, false, await this.segmentFds(state.leaseId));
        unmap = host.close;
        return { ...base, backend: 'host', tensors: host.tensors };
      }
      const cuda = await openCuda(state, options.deviceIndex ?? state.device.index, await this.#cudaFds(state));
      unmap = cuda.close;
      return { ...base, backend: 'cuda', tensors: cuda.tensors };
    } catch (err) {
      await detach().catch(() => {});
      throw err;
    }
  }

  /** Copies every tensor into this process (mode "copy"), then drops the lease. */
  async copy(expected: Expected, options: AttachOptions = {}): Promise<Copied | MismatchReply> {
    const state = await this.getState(expected, 'copy', options.layout);
    if (state.status === 'mismatch') return state;
    let tensors: Copied['tensors'];
    try {
      if (state.backend === 'host') tensors = openHost(state, true, await this.segmentFds(state.leaseId)).tensors;
      else {
        const cuda = await openCuda(state, options.deviceIndex ?? state.device.index, await this.#cudaFds(state));
        try {
          tensors = await cuda.read();
        } finally {
          cuda.close();
        }
      }
    } catch (err) {
      // The copy's own failure is what the caller hears: a detach that fails too (the daemon
      // gone meanwhile) must not replace it.
      await this.detach(state.leaseId).catch(() => {});
      throw err;
    }
    await this.detach(state.leaseId);
    return { status: 'copied', state, tensors };
  }

  /** A cuda rank's descriptors when it serves "cuda-fd" segments (--cuda-handles fd); none for legacy IPC. */
  async #cudaFds(state: StateReply): Promise<Map<number, number> | undefined> {
    return state.segments.some((s) => s.handle === CUDA_FD_HANDLE) ? this.segmentFds(state.leaseId) : undefined;
  }

  /**
   * get_segment_fds for `leaseId` (get_state's host "fd" and cuda "cuda-fd" handles): each
   * segment's descriptor (a sealed memfd, or VMM memory), by segment number, the caller's to close. Asked on a connection of its own through the addon
   * (native/unix_fds.h), since a net.Socket cannot receive descriptors; the daemon knows this
   * process's lease by its pid. Whatever fails, no received descriptor is left open.
   */
  async segmentFds(leaseId: string): Promise<Map<number, number>> {
    const id = this.#nextId++;
    const request = encodeMessage({ id, cmd: 'get_segment_fds', leaseId });
    let received: { frame: Buffer; fds: number[] };
    try {
      received = await addon().unixRequest(this.socketPath, request, [], this.#timeoutMs, FRAME_HEADER_BYTES + MAX_REQUEST_BYTES);
    } catch (err) {
      // The codes this client raises for the same failures on its own connection.
      const code = { E_CONNECT: 'E_CONNECT', E_PEER_UID: 'E_PEER', E_FD_TIMEOUT: 'E_TIMEOUT' }[(err as { code?: string }).code ?? ''] ?? 'E_DISCONNECTED';
      throw new ServeError(code as 'E_CONNECT', `cannot get the segment descriptors from ${this.socketPath}: ${(err as Error).message}`, { socketPath: this.socketPath }, { cause: err });
    }
    const { frame, fds } = received;
    try {
      const [payload] = new FrameDecoder(MAX_REQUEST_BYTES).push(frame);
      const raw = parsePayload(payload!, JSON.parse);
      const reply = this.#checkReply('get_segment_fds', raw);
      if (reply.id !== id) throw new ProtocolError('E_BAD_REPLY', `unexpected reply (id ${reply.id}) to get_segment_fds from ${this.socketPath}`);
      if (reply.segments.length !== fds.length) {
        throw new ProtocolError('E_BAD_REPLY', `get_segment_fds from ${this.socketPath} lists ${reply.segments.length} segment(s) but ${fds.length} descriptor(s) came with it`);
      }
      return new Map(reply.segments.map((segment, i) => [segment, fds[i]!]));
    } catch (err) {
      for (const fd of fds) addon().closeFd(fd);
      throw err;
    }
  }

  /** Drops a lease (default: every lease taken on this connection). Returns how many. */
  async detach(leaseId?: string): Promise<number> {
    const reply: DetachReply = await this.#request('detach', leaseId === undefined ? {} : { leaseId });
    return reply.dropped;
  }

  release(options: { force?: boolean } = {}): Promise<ReleaseReply> {
    return this.#request('release', options.force === undefined ? {} : { force: options.force });
  }

  stats(): Promise<StatsReply> {
    return this.#request('stats', {});
  }

  /**
   * Asks to be told, on this connection, when a newer version of `model` is ready on this device
   * and when a version of it is about to be dropped (onEvent; docs/protocol.md, Events); with
   * `stale`, also when one is stale (its checkpoint files changed). A watch lives as long as the
   * connection: after a reconnect (the daemon restarted), watch again.
   */
  watch(model: string, { stale = false }: { stale?: boolean } = {}): Promise<WatchReply> {
    return this.#request('watch', stale ? { model, stale } : { model });
  }

  /** Calls `listener` with every event frame (model_ready, model_dropping, lease_revoked, model_stale) from now on. */
  onEvent(listener: (event: ModelEvent) => void): () => void {
    this.#eventListeners.add(listener);
    return () => this.#eventListeners.delete(listener);
  }

  close(): void {
    this.#socket?.destroy();
    this.#socket = undefined;
    this.#refusal = undefined;
  }

  #open(): Promise<void> {
    return new Promise((resolve, reject) => {
      const socket = connect(this.socketPath);
      socket.once('error', (err: NodeJS.ErrnoException) => {
        const hint = err.code === 'ENOENT' || err.code === 'ECONNREFUSED' ? '; the daemon is not serving this device (load from disk)' : '';
        reject(new ServeError('E_CONNECT', `cannot connect to weightd socket ${this.socketPath}: ${err.message}${hint}`, { socketPath: this.socketPath }, { cause: err }));
      });
      socket.once('connect', () => {
        try {
          this.#checkPeer(socket);
        } catch (err) {
          socket.destroy();
          reject(err);
          return;
        }
        socket.removeAllListeners('error');
        socket.on('error', () => {}); // 'close' follows and fails the waiting request
        socket.on('data', (chunk: Buffer) => this.#onData(socket, chunk));
        socket.on('close', () => this.#onClose(socket));
        this.#socket = socket;
        this.#decoder = new FrameDecoder(MAX_RESPONSE_BYTES);
        this.#awaitingPacked = undefined;
        resolve();
      });
    });
  }

  /** A socket served by another user could hand us someone else's memory: refuse it. */
  #checkPeer(socket: Socket): void {
    const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
    if (fd === undefined || fd < 0) throw new ServeError('E_PEER', `cannot check who serves ${this.socketPath}: the socket has no descriptor`);
    const peer = addon().peerCredentials(fd);
    const uid = process.getuid!();
    if (peer.uid !== uid) {
      throw new ServeError('E_PEER', `socket ${this.socketPath} is served by uid ${peer.uid} (pid ${peer.pid}), not by this user (uid ${uid}); refusing it`, { peerUid: peer.uid });
    }
  }

  #onData(socket: Socket, chunk: Buffer): void {
    // Event frames (watch) may come while nothing is asked: every byte of the current
    // connection is decoded; any other connection's are stale.
    if (this.#socket !== socket && this.#waiting?.socket !== socket) return;
    if (this.#waiting?.socket === socket) this.#replyStarted = true;
    let frames: Buffer[];
    try {
      frames = this.#decoder.push(chunk);
    } catch (err) {
      this.#failWaiting(err as Error);
      socket.destroy();
      return;
    }
    for (const frame of frames) {
      const w = this.#waiting;
      const trailed = this.#awaitingPacked;
      if (trailed) {
        // The frame after a packed reply is its manifest, not JSON (docs/spec/manifest-packed.md §1).
        this.#awaitingPacked = undefined;
        if (frame.length !== trailed.value.packed) {
          // Its lease was granted: getState gives it back.
          const { leaseId } = trailed.value as { leaseId?: unknown };
          const lease = typeof leaseId === 'string' ? { leaseId } : {};
          this.#failWaiting(new ProtocolError('E_BAD_REPLY', `the packed manifest from ${this.socketPath} is ${frame.length} bytes, but its reply announced ${String(trailed.value.packed)}`, lease));
          socket.destroy();
          return;
        }
        trailed.value.packed = frame;
        this.#waiting = undefined;
        w?.resolve(trailed.value);
        continue;
      }
      let value: unknown;
      try {
        // Replies come from the user's own daemon, and a manifest of 100k tensors is 13 MiB:
        // the nesting scan would add half of JSON.parse's time to every attach.
        value = parsePayload(frame, JSON.parse);
      } catch (err) {
        this.#failWaiting(err as Error);
        socket.destroy();
        return;
      }
      const event = ModelEvent.safeParse(value);
      if (event.success) {
        for (const l of this.#eventListeners) l(event.data);
        continue;
      }
      const id = (value as { id?: unknown } | null)?.id;
      if (!w && id === null && ErrorReply.safeParse(value).success) {
        this.#refusal = value;
        continue;
      }
      if (w && id === w.id && (value as { ok?: unknown }).ok === true && typeof (value as { packed?: unknown }).packed === 'number') {
        this.#awaitingPacked = { value: value as { packed: number } };
        continue;
      }
      this.#waiting = undefined;
      // One request at a time on a connection that is dropped after any failure: a reply is to
      // the waiting request (id null: the daemon could not read one, as for a protocol error).
      if (w && (id === w.id || id === null)) w.resolve(value);
      else {
        w?.reject(new ProtocolError('E_BAD_REPLY', `unexpected reply (id ${JSON.stringify(id)}) from ${this.socketPath}`));
        socket.destroy();
        return;
      }
    }
  }

  #onClose(socket: Socket): void {
    if (this.#socket === socket) this.#socket = undefined;
    if (this.#waiting?.socket !== socket) return;
    const Cls = this.#replyStarted ? ServeError : ClosedBeforeReply;
    this.#failWaiting(new Cls('E_DISCONNECTED', `weightd closed the connection on ${this.socketPath} before replying`));
  }

  #failWaiting(err: Error): void {
    const w = this.#waiting;
    this.#waiting = undefined;
    w?.reject(err);
  }

  #request<C extends Command>(cmd: C, body: Record<string, unknown>): Promise<Reply<C>> {
    const run = async (): Promise<Reply<C>> => {
      const reused = this.#socket !== undefined;
      let raw: unknown;
      try {
        raw = await this.#exchange(cmd, body);
      } catch (err) {
        if (!(err instanceof ClosedBeforeReply && reused)) throw err;
        raw = await this.#exchange(cmd, body);
      }
      return this.#checkReply(cmd, raw);
    };
    const result = this.#chain.then(run, run);
    this.#chain = result.catch(() => {});
    return result;
  }

  /** A raw reply as `cmd`'s schema says, or the daemon's refusal as a ServeError with its code. */
  #checkReply<C extends Command>(cmd: C, raw: unknown): Reply<C> {
    const failed = ErrorReply.safeParse(raw);
    if (failed.success) {
      const e = failed.data.error;
      throw new ServeError(receivedCode(e.code), `weightd (${this.socketPath}) refused ${cmd}: ${e.message}`, e.details ?? {});
    }
    const parsed = REPLY_SCHEMAS[cmd].safeParse(raw);
    if (!parsed.success) {
      const issues = parsed.error.issues.slice(0, 3).map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
      throw new ProtocolError('E_BAD_REPLY', `reply to ${cmd} from ${this.socketPath} does not match the protocol: ${issues}; client and daemon versions differ?`);
    }
    return parsed.data as Reply<C>;
  }

  /** Sends one request and resolves with the raw reply. Any failure drops the connection. */
  async #exchange(cmd: Command, body: Record<string, unknown>): Promise<unknown> {
    const refusal = this.#refusal;
    if (refusal !== undefined) {
      this.#refusal = undefined;
      this.close();
      return refusal;
    }
    if (!this.#socket) await this.#open();
    const socket = this.#socket!;
    const id = this.#nextId++;
    this.#replyStarted = false;
    try {
      return await new Promise<unknown>((resolve, reject) => {
        const timer = setTimeout(() => {
          this.#failWaiting(new ServeError('E_TIMEOUT', `no reply to ${cmd} from ${this.socketPath} within ${this.#timeoutMs} ms`));
        }, this.#timeoutMs);
        this.#waiting = {
          id,
          socket,
          resolve: (v) => (clearTimeout(timer), resolve(v)),
          reject: (e) => (clearTimeout(timer), reject(e)),
        };
        socket.write(encodeMessage({ id, cmd, ...body }));
      });
    } catch (err) {
      socket.destroy();
      if (this.#socket === socket) this.#socket = undefined;
      throw err;
    }
  }
}
