// The state of one served rank of one model version, and only that: what it serves (the
// manifest per layout, encoded once), where it is in its lifecycle (rankServiceMachine.ts) and
// who holds its memory (leaseTable.ts). The commands that read and change it are in handlers/;
// the socket, its connections and who may connect are the device server's (deviceServer.ts),
// which serves every model version resident on its device.
import { deserializeError, ServeError, type SerializedError } from '../errors.js';
import { describeChange, type IdentityChange } from '../files/fileIdentity.js';
import type { FilesCheck } from './filesCheck.js';
import type { Logger } from '../log.js';
import type { SegmentExport } from '../native/addon.js';
import { EncodedManifest } from './encodedManifest.js';
import { closeLayout, ProcessedLayouts } from './processedLayouts.js';
import { leaseHash, LeaseTable, type Caller, type Lease } from './leaseTable.js';
import type { DeviceRef, ProcessedLayoutStatus, RankRef, ServeStatus } from '../wire/protocol.js';
import { rankServiceStart, rankServiceStep, type RankServiceEvent } from './rankServiceMachine.js';
import type { ServedRankData } from './servedRankData.js';

export interface RankServiceOptions {
  rank: ServedRankData;
  log: Logger;
  /** Frees the rank's memory; resolves once it is freed. Called at most once. */
  freeMemory: () => Promise<void>;
  /** Its version turned stale (its checkpoint files changed): called once, with each change and all of them described. */
  onStale?: (changes: IdentityChange[], described: string) => void;
  /**
   * Its segments are adopted descriptors still being checked (a cuda rank adopted with no CUDA
   * context, src/actors/adoptHere.ts): get_segment_fds waits for descriptorsChecked().
   */
  descriptorsChecking?: boolean;
}

/** What the device server lets a service do to the connections it does not own. */
export interface ConnectionNotifier {
  /** Writes an event frame on a connection, if it is still open (docs/protocol.md, Events). */
  notify(connectionId: number, event: Record<string, unknown>): void;
  /** Tells the connections that watch this service's model that it is ready, about to be dropped, or stale (with `fields`). */
  announce(service: RankService, event: 'model_ready' | 'model_dropping' | 'model_stale', fields?: Record<string, unknown>): void;
}

/** Ends no one's lease in particular: a forced unload revokes every lease. */
const NOBODY: Caller = { pid: -1, connectionId: -1 };

/** What get_state says a segment's handle is: "fd" for a host memfd (the client asks get_segment_fds for it), else the backend's own. */
function servedHandle(s: SegmentExport): string {
  return s.handle === 'memfd' ? 'fd' : s.handle;
}

export class RankService {
  readonly rank: ServedRankData;
  readonly log: Logger;
  readonly leases = new LeaseTable();
  /** What engines computed from this rank's bytes and published (publishDesk.ts); freed with the rank. */
  readonly processed = new ProcessedLayouts();
  readonly startedAt = Date.now();
  /** Set by the device server that serves this rank. */
  notifier: ConnectionNotifier | undefined;
  readonly deviceRef: DeviceRef;
  readonly rankRef: RankRef;
  readonly #freeMemory: () => Promise<void>;
  readonly #onStale: RankServiceOptions['onStale'];
  /** Its version's file check (shared by the version's ranks), once served (watchFiles). */
  #files: FilesCheck | undefined;
  #unwatchFiles: () => void = () => {};
  /** The manifest part of every get_state reply, per layout, encoded once (100k tensors: tens of MB). */
  readonly #manifests: Map<string, EncodedManifest>;
  #lifecycle = rankServiceStart();
  #releaseDone: Promise<void> | undefined;
  /** Replies carrying this rank's descriptors that are still being sent (holdSegmentFds). */
  #fdSends = 0;
  /** What waits for the last of them (#whenFdsSent). */
  #fdSendsSettled: (() => void)[] = [];
  /** Settles once no descriptor check is pending (RankServiceOptions.descriptorsChecking): rejected by a failed one. */
  readonly #descriptorsChecked: Promise<void>;
  #settleCheck: ((error?: SerializedError) => void) | undefined;

  constructor(options: RankServiceOptions) {
    const r = options.rank;
    this.rank = r;
    this.log = options.log;
    this.#freeMemory = options.freeMemory;
    this.#onStale = options.onStale;
    this.#descriptorsChecked = options.descriptorsChecking
      ? new Promise<void>((resolve, reject) => (this.#settleCheck = (error) => (error ? reject(deserializeError(error)) : resolve())))
      : Promise.resolve();
    // Awaited by get_segment_fds only: a failure no request waits for is not an unhandled rejection.
    this.#descriptorsChecked.catch(() => undefined);
    const d = r.device;
    this.deviceRef = { uuid: d.uuid, backend: d.backend, index: d.index, name: d.name };
    this.rankRef = { globalRank: r.globalRank, localRank: r.localRank, nodeRank: r.nodeRank, nnodes: r.nnodes, tpSize: r.tpSize };
    const segments = r.segments.map((s) => ({ segment: s.segment, bytes: s.bytes, handle: servedHandle(s), ...(s.memory !== undefined ? { memory: s.memory } : {}) }));
    this.#manifests = new Map(Object.entries(r.layouts).map(([layout, views]) => [
      layout,
      new EncodedManifest(
        { fingerprint: r.fingerprint, backend: r.backend, device: this.deviceRef, rank: this.rankRef, layout, segments },
        views,
        // Its digests by name are made on first read (servedRankData.ts): only a get_state that asks for them reads them.
        r.full,
      ),
    ]));
  }

  get status(): ServeStatus {
    return this.#lifecycle.value;
  }

  /** The model's name (several versions of one name may be resident during a swap). */
  get name(): string {
    return this.rank.name;
  }

  /**
   * Checks this version's checkpoint files from now on (`check` is shared by its ranks): once one
   * changed, it refuses new leases (E_STALE), tells the connections that watch its model
   * (model_stale), and calls onStale.
   */
  watchFiles(check: FilesCheck): void {
    this.#unwatchFiles();
    this.#files = check;
    this.#unwatchFiles = check.onStale((changes) => {
      this.notifier?.announce(this, 'model_stale', { files: changes.map(describeChange) });
      this.#onStale?.(changes, changes.map(describeChange).join('; '));
    });
  }

  /** Stops checking (the version is no longer served here). */
  unwatchFiles(): void {
    this.#unwatchFiles();
    this.#unwatchFiles = () => {};
  }

  /**
   * Stats its checkpoint files unless the last check still stands (FilesCheck); a change makes it
   * stale. Only while it serves: a version that drains takes no new lease anyway, and is not to
   * be loaded again (a newer version of its name, or none, replaced it).
   */
  async checkFiles(): Promise<void> {
    if (this.status === 'serving') await this.#files?.check();
  }

  /**
   * Throws unless the rank serves: no new lease is given out once it drains or a release began,
   * nor once its checkpoint files changed (E_STALE). `newer` is the fingerprint of a newer version
   * of the same model on this device, if any.
   */
  refuseUnlessServing(newer?: string): void {
    const stale = this.#files?.stale;
    if (stale) {
      throw new ServeError(
        'E_STALE',
        `model "${this.name}" version ${this.rank.fingerprint.slice(0, 12)} (rank ${this.rank.globalRank}) is stale: its checkpoint files changed since it was loaded ` +
          `(${stale.map(describeChange).join('; ')}); load the weights from disk. weightd reloads it: a get_state with the same fingerprint attaches the reloaded version once it serves`,
        { model: this.name, fingerprint: this.rank.fingerprint, files: stale },
      );
    }
    if (this.status === 'serving') return;
    if (this.status === 'draining') {
      throw new ServeError(
        'E_DRAINING',
        `model "${this.name}" version ${this.rank.fingerprint.slice(0, 12)} (rank ${this.rank.globalRank}) is being unloaded and takes no new lease; ` +
          (newer ? `attach to its newer version (fingerprint ${newer}), or load from disk` : 'load the weights from disk'),
        { model: this.name, fingerprint: this.rank.fingerprint, ...(newer ? { newer } : {}) },
      );
    }
    this.refuseIfFreed(newer);
  }

  /**
   * Throws E_RELEASED or E_RELEASING once a release began: the memory is (being) freed, and no
   * descriptor is given out. `newer`, as for refuseUnlessServing, goes in the details.
   */
  refuseIfFreed(newer?: string): void {
    if (this.status === 'serving' || this.status === 'draining') return;
    const released = this.status === 'released';
    throw new ServeError(
      released ? 'E_RELEASED' : 'E_RELEASING',
      `rank ${this.rank.globalRank}'s cache on device ${this.rank.device.uuid} ${released ? 'was released' : 'is being released'}; ` +
        (newer ? `attach to the newer version of "${this.name}" (fingerprint ${newer}), or load the weights from disk` : 'load the weights from disk (or restart weightd to cache them again)'),
      newer ? { model: this.name, newer } : {},
    );
  }

  /**
   * Serving -> draining: no new lease from now on; the memory is freed once the last lease ends,
   * or at once with `force`, which revokes every lease and tells each holder's connection
   * (lease_revoked). Returns the revoked leases. A rank already draining may still be forced; one
   * whose release began is left as it is.
   */
  drain(force: boolean): Lease[] {
    if (this.status === 'serving') {
      this.#step({ type: 'DRAIN' });
      this.notifier?.announce(this, 'model_dropping');
    }
    if (this.status !== 'draining') return [];
    const revoked = force ? this.leases.clear(NOBODY) : [];
    for (const l of revoked) {
      this.logLease(l, 'lease revoked by a forced unload');
      this.notifier?.notify(l.connectionId, { event: 'lease_revoked', model: this.name, fingerprint: this.rank.fingerprint, leaseHash: leaseHash(l.id) });
    }
    this.log.info({ model: this.name, globalRank: this.rank.globalRank, force, leases: this.leases.size }, this.leases.size > 0 ? 'draining: freed once the last lease ends' : 'draining: no lease holds it');
    this.leasesEnded();
    return revoked;
  }

  /** Leases ended (detach, exit, connection closed): a draining rank with none left is freed now. */
  leasesEnded(): void {
    if (this.status !== 'draining' || this.leases.size > 0) return;
    this.release().catch((err: unknown) => this.log.error({ err, globalRank: this.rank.globalRank }, 'freeing a drained rank failed'));
  }

  /**
   * The adopted descriptors' check ended (RankServiceOptions.descriptorsChecking): passed, or
   * failed with `error`, which every get_segment_fds waiting or to come is refused with. Only the
   * first call counts (a withdrawal after the check's end changes nothing).
   */
  descriptorsChecked(error?: SerializedError): void {
    this.#settleCheck?.(error);
    this.#settleCheck = undefined;
  }

  /** Resolves once no client can be given a descriptor that failed, or has yet to pass, its check. */
  untilDescriptorsChecked(): Promise<void> {
    return this.#descriptorsChecked;
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
      if (--this.#fdSends === 0) for (const settled of this.#fdSendsSettled.splice(0)) settled();
    };
  }

  /** Runs `then` once no reply carrying this rank's descriptors is on its way: at once when none is. */
  #whenFdsSent<T>(then: () => Promise<T>): Promise<T> {
    if (this.#fdSends === 0) return then();
    return new Promise<void>((resolve) => this.#fdSendsSettled.push(resolve)).then(then);
  }

  /**
   * Closes the published layouts' descriptors once no reply carrying them is on its way (a
   * get_processed reply holds them as holdSegmentFds does): for a stop, which does not release.
   */
  closeProcessed(): void {
    this.#whenFdsSent(async () => this.processed.close()).catch((err: unknown) => this.log.error({ err, globalRank: this.rank.globalRank }, 'closing the published layouts failed'));
  }

  /** Each processed layout served beside this rank, oldest first: for status, metrics and the eviction policy. */
  processedStatus(): ProcessedLayoutStatus[] {
    return this.processed.layouts().map((l) => ({
      key: l.key,
      base: this.rank.fingerprint,
      bytes: l.bytes,
      leases: this.leases.processedLeases(l.key),
      publishedAt: l.publishedAt,
      ...(l.lastMappedAt === undefined ? {} : { lastMappedAt: l.lastMappedAt }),
    }));
  }

  /**
   * Drops the processed layout `key` to make room for a load (src/models/evictionPolicy.ts), only
   * while no lease holds it: an engine that maps it keeps its pages whatever the daemon closes, so
   * dropping a leased one would free nothing. get_processed stops finding it at once; its
   * descriptors close once no reply carrying them is on its way. Resolves to whether it dropped it.
   */
  async dropProcessed(key: string): Promise<boolean> {
    if (this.leases.processedLeases(key) > 0) return false;
    const layout = this.processed.remove(key);
    if (!layout) return false;
    await this.#whenFdsSent(async () => closeLayout(layout));
    this.log.info({ model: this.name, globalRank: this.rank.globalRank, key, bytes: layout.bytes }, 'processed layout dropped to make room for a load: the next engine start with its key processes again');
    return true;
  }

  /** The served layouts, in the plan's order. */
  get layouts(): string[] {
    return [...this.#manifests.keys()];
  }

  /** A layout's encoded manifest; undefined when the layout is not served. */
  manifest(layout: string): EncodedManifest | undefined {
    return this.#manifests.get(layout);
  }

  /**
   * Serving or draining -> releasing, at once (no lease is granted from here on); frees the
   * memory, then -> released, whether freeing worked or not. Resolves once freed. Throws
   * E_ILLEGAL_TRANSITION otherwise: a second release waits on `releaseDone` instead.
   */
  release(): Promise<void> {
    this.#step({ type: 'RELEASE_ALLOWED' });
    // At once when no descriptor is on its way: a release that waits on nothing frees now.
    const freed = this.#whenFdsSent(() => this.#freeMemory()).finally(() => this.processed.close());
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

  /** A connection closed: its copy leases end with it. */
  connectionClosed(caller: Caller): void {
    const ended = this.leases.connectionClosed(caller.connectionId);
    for (const l of ended) this.logLease(l, 'lease ended with its connection');
    if (ended.length > 0) this.leasesEnded();
  }

  expireDeadLeases(): void {
    const ended = this.leases.expireDead();
    for (const l of ended) this.logLease(l, 'lease ended: client exited');
    if (ended.length > 0) this.leasesEnded();
  }

  logLease(l: Lease, msg: string, client?: string): void {
    this.log.info({ lease: leaseHash(l.id), peerPid: l.owner.pid, mode: l.mode, leases: this.leases.size, model: this.name, client }, msg);
  }

  #step(event: RankServiceEvent): void {
    this.#lifecycle = rankServiceStep(this.#lifecycle, event, `rank ${this.rank.globalRank}`);
  }
}
