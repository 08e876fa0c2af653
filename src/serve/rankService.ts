// The state of one served rank, and only that: what it serves (the manifest per layout, cached
// as text), where it is in its lifecycle (rankServiceMachine.ts), who holds its memory
// (leaseTable.ts), who is connected, and the counters stats reports. The commands that read and
// change it are in handlers/; the socket and who may connect are the rank server's.
import { ServeError } from '../errors.js';
import type { Logger } from '../log.js';
import type { SegmentExport } from '../native/addon.js';
import type { ClientConnection } from './clientConnection.js';
import { leaseHash, LeaseTable, type Caller, type Lease } from './leaseTable.js';
import type { DeviceRef, RankRef, ServeStatus } from './protocol.js';
import { rankServiceStart, rankServiceStep, type RankServiceEvent } from './rankServiceMachine.js';
import type { ServedRank } from './servedRank.js';

export interface RankServiceOptions {
  rank: ServedRank;
  log: Logger;
  /** Frees the rank's memory; resolves once it is freed. Called at most once. */
  freeMemory: () => Promise<void>;
}

export interface RankServiceStats {
  status: ServeStatus;
  connections: number;
  leases: number;
  requests: number;
  protocolErrors: number;
  refusedPeers: number;
}

/** What get_state says a segment's handle is: "fd" for a host memfd (the client asks get_segment_fds for it), else the backend's own. */
function servedHandle(s: SegmentExport): string {
  return s.handle === 'memfd' ? 'fd' : s.handle;
}

export class RankService {
  readonly rank: ServedRank;
  readonly log: Logger;
  readonly leases = new LeaseTable();
  /** Open connections by id: what the server closes when it stops. */
  readonly connections = new Map<number, ClientConnection>();
  readonly counters = { requests: 0, protocolErrors: 0, refusedPeers: 0 };
  readonly startedAt = Date.now();
  readonly deviceRef: DeviceRef;
  readonly rankRef: RankRef;
  readonly #freeMemory: () => Promise<void>;
  /** The manifest part of every get_state reply, per layout, serialized once (100k tensors: tens of MB). */
  readonly #manifestJson: Map<string, string>;
  #lifecycle = rankServiceStart();
  #releaseDone: Promise<void> | undefined;
  /** Replies carrying this rank's descriptors that are still being sent (holdSegmentFds). */
  #fdSends = 0;
  #fdSendsSettled: (() => void) | undefined;

  constructor(options: RankServiceOptions) {
    const r = options.rank;
    this.rank = r;
    this.log = options.log;
    this.#freeMemory = options.freeMemory;
    const d = r.device;
    this.deviceRef = { uuid: d.uuid, backend: d.backend, index: d.index, name: d.name };
    this.rankRef = { globalRank: r.globalRank, localRank: r.localRank, nodeRank: r.nodeRank, nnodes: r.nnodes, tpSize: r.tpSize };
    this.#manifestJson = new Map(Object.entries(r.layouts).map(([layout, views]) => [layout, JSON.stringify({
      fingerprint: r.fingerprint,
      backend: r.backend,
      device: this.deviceRef,
      rank: this.rankRef,
      layout,
      tensors: views.tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, segment: t.segment, offset: t.offset, bytes: t.bytes })),
      aliases: views.aliases,
      segments: r.segments.map((s) => ({ segment: s.segment, bytes: s.bytes, handle: servedHandle(s) })),
    })]));
  }

  get status(): ServeStatus {
    return this.#lifecycle.value;
  }

  /** Throws E_RELEASED or E_RELEASING unless the rank serves: no lease nor descriptor is given out after a release began. */
  refuseUnlessServing(): void {
    if (this.status === 'serving') return;
    const released = this.status === 'released';
    throw new ServeError(
      released ? 'E_RELEASED' : 'E_RELEASING',
      `rank ${this.rank.globalRank}'s cache on device ${this.rank.device.uuid} ${released ? 'was released' : 'is being released'}; load the weights from disk (or restart weightd to cache them again)`,
    );
  }

  /** Every segment's descriptor in segment order, or undefined when the backend has none (cuda legacy IPC). */
  segmentFds(): number[] | undefined {
    const fds = this.rank.segments.map((s) => s.fd);
    return fds.every((fd): fd is number => fd !== undefined) ? fds : undefined;
  }

  /**
   * Marks this rank's descriptors as on their way to a client; the returned call ends the mark.
   * release() frees the memory, which closes them, only once every mark has ended: a send must
   * never meet a closed descriptor number, nor one the process has since reused for a file.
   */
  holdSegmentFds(): () => void {
    this.#fdSends++;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      if (--this.#fdSends === 0) this.#fdSendsSettled?.();
    };
  }

  /** The served layouts, in the plan's order. */
  get layouts(): string[] {
    return [...this.#manifestJson.keys()];
  }

  /** A layout's manifest as JSON text; undefined when the layout is not served. */
  manifestJson(layout: string): string | undefined {
    return this.#manifestJson.get(layout);
  }

  /**
   * Serving -> releasing, at once (no lease is granted from here on); frees the memory, then
   * -> released, whether freeing worked or not. Resolves once freed. Throws E_ILLEGAL_TRANSITION
   * unless serving: a second release waits on `releaseDone` instead.
   */
  release(): Promise<void> {
    this.#step({ type: 'RELEASE_ALLOWED' });
    // At once when no descriptor is on its way: a release that waits on nothing frees now.
    const freed = this.#fdSends === 0 ? this.#freeMemory() : new Promise<void>((resolve) => (this.#fdSendsSettled = resolve)).then(() => this.#freeMemory());
    this.#releaseDone = freed.then(
      () => {
        this.#step({ type: 'MEMORY_FREED' });
        this.log.info({ globalRank: this.rank.globalRank }, 'rank released');
      },
      (err: unknown) => {
        this.#step({ type: 'FREEING_FAILED' });
        throw new ServeError('E_RELEASE_FAILED', `freeing rank ${this.rank.globalRank} failed: ${(err as Error).message}`, {}, { cause: err });
      },
    );
    return this.#releaseDone;
  }

  /** Settles when the release under way is done (rejects if freeing failed); undefined while serving. */
  get releaseDone(): Promise<void> | undefined {
    return this.#releaseDone;
  }

  stats(): RankServiceStats {
    return { status: this.status, connections: this.connections.size, leases: this.leases.size, ...this.counters };
  }

  /** A connection closed: its copy leases end with it. */
  connectionClosed(caller: Caller): void {
    this.connections.delete(caller.connectionId);
    for (const l of this.leases.connectionClosed(caller.connectionId)) this.logLease(l, 'lease ended with its connection');
  }

  expireDeadLeases(): void {
    for (const l of this.leases.expireDead()) this.logLease(l, 'lease ended: client exited');
  }

  logLease(l: Lease, msg: string, client?: string): void {
    this.log.info({ lease: leaseHash(l.id), peerPid: l.owner.pid, mode: l.mode, leases: this.leases.size, client }, msg);
  }

  #step(event: RankServiceEvent): void {
    this.#lifecycle = rankServiceStep(this.#lifecycle, event, `rank ${this.rank.globalRank}`);
  }
}
