// What a node reports about itself: plain data shared by the machine, the composition root and
// the inspect layer. A leaf: it takes types only, from modules that import nothing back, so no
// reader of the status is pulled into an import circle.
import type { SerializedError } from './errors.js';
import type { IdentityChange } from './files/fileIdentity.js';
import type { DeviceInfo, SegmentExport } from './native/addon.js';
import type { RankTableEntry } from './wire/rankTable.js';
import type { ProcessedLayoutStatus, ServeStatus } from './wire/protocol.js';

/**
 * `true` when a machine's state names (xstate's StateValueFrom) are exactly `Declared`, else
 * `false`. Each machine asserts it of the union below that names its states (`true satisfies`),
 * so a state added, renamed or dropped in a machine fails tsc until the status says it too.
 */
export type SameStateNames<Derived, Declared> = [Derived] extends [Declared] ? ([Declared] extends [Derived] ? true : false) : false;

/**
 * The supervisor's states (src/machines/supervisor.ts): "loading" while its first model's actor
 * loads, "starting" once that model binds its sockets (its model machine's "starting") until
 * every model the node starts with serves, then "ready".
 */
export type NodeState = 'init' | 'reportingFailure' | 'rendezvous' | 'loading' | 'starting' | 'ready' | 'stopping' | 'stopped' | 'failed';

export type RankState = 'starting' | 'loading' | 'loaded' | 'serving' | 'released' | 'stopped' | 'failed';

/**
 * Where a loaded rank's bytes came from: the checkpoint (with why the keeper's shard was refused,
 * when it held one), or a keeper (with the kept record's age).
 */
export type RankSource =
  | { from: 'checkpoint'; refused?: string }
  /** thread: main when adopted with no worker thread and no device context (src/actors/adoptHere.ts), worker on the rank's worker thread. */
  | { from: 'keeper'; keptAt: string; ageMs: number; thread: 'main' | 'worker' }
  /** thread: main for a version a writer committed on the host backend or on cuda with descriptors (adoptWrittenHere), else worker. */
  | { from: 'writer'; thread: 'main' | 'worker' };

export interface RankStatus {
  localRank: number;
  globalRank: number;
  state: RankState;
  device?: DeviceInfo;
  bytes: number;
  totalBytes: number;
  seconds: number;
  segments?: SegmentExport[];
  socketPath?: string;
  /** Once loaded: read from the checkpoint, or adopted from a keeper. */
  source?: RankSource;
  /** Once loaded: the plan's contentTensors' digests, in order (docs/spec/fingerprint.md, version 3). */
  digests?: string[];
  /** With a keeper: whether it holds this rank's segments now, and why not when it does not. */
  kept?: boolean;
  keptReason?: string;
  /**
   * Adopted descriptors checked after READY (a cuda rank adopted with no CUDA context,
   * src/actors/adoptHere.ts): 'checking' until the check ends, then 'checked' or 'refused' (the
   * rank then fails). Absent where every check ran before the rank said loaded.
   */
  descriptors?: 'checking' | 'checked' | 'refused';
  /**
   * While loading: true when the rank waits for the node's other ranks of its model (the cuda fill
   * group before its fill, the host digest group after it), so a rank at 0% or 100% that does not
   * move says why; absent otherwise.
   */
  waitingForGroup?: true;
}

export interface PeerStatus {
  nodeRank: number;
  state: 'up' | 'lost';
  reason?: string;
  since: number;
}

/** During rendezvous: the node ranks node 0's coordinator has accepted, and those it waits for. */
export interface GroupFormation {
  joined: number[];
  missing: number[];
}

export interface NodeFailure extends SerializedError {
  localRank?: number;
  globalRank?: number;
}

/** The model machine's states (src/models/modelMachine.ts): "starting" binds the sockets, "serving" is attachable. */
export type ModelMachineState = 'admitting' | 'loading' | 'verifying' | 'resident' | 'starting' | 'serving' | 'draining' | 'released' | 'stopping' | 'stopped' | 'failing' | 'failed';

/** The model registry's states (src/models/modelRegistryMachine.ts), which /statechart highlights. */
export type RegistryState = 'startup' | 'running' | 'stopping' | 'stopped' | 'stopTimedOut' | 'halted';

/** A model version's state: the model machine's, or for the node's first model the node's until its model actor exists. */
export type ModelState = ModelMachineState | Exclude<NodeState, 'ready'>;

/**
 * Each rank as status reports it: clients and leases are its version's counters on its device's
 * socket, processed the layouts engines published beside it (memory of its own on the rank's
 * device, freed with the rank, or dropped alone to make room for a load: docs/operations.md,
 * Eviction).
 */
export type ServedRankStatus = RankStatus & {
  clients?: number;
  leases?: number;
  serve?: ServeStatus;
  lastAttachedAt?: number;
  servingSince?: number;
  current?: boolean;
  processed?: ProcessedLayoutStatus[];
};

export interface ModelStatus {
  name: string;
  /** The node's own model (the one --model named first, model-0), which its group forms around; a newer version of its name is not. */
  own: boolean;
  state: ModelState;
  model: string;
  fingerprint?: string;
  tpSize: number;
  /** Its number among its name's versions: 0 for a checkpoint, N+1 for each commit of a writer (docs/weight-updates.md). */
  version: number;
  /**
   * The version of its name that clients are pointed to (the newest that serves, or the one a
   * rollback chose): the others of its name that serve are retained (--keep-versions).
   */
  current: boolean;
  /** Resident bytes of all its ranks (their segments; processed layouts are processedBytes). */
  bytes: number;
  /** Bytes of the processed layouts published beside its ranks (ServedRankStatus.processed): memory it holds besides `bytes`. */
  processedBytes: number;
  /** Live leases over all its ranks. */
  leases: number;
  /**
   * When a client last attached to any of its ranks, or (none has) when it began serving: ms
   * since the epoch, what --evict no-lease-lru orders by. Absent until it serves.
   */
  lastUsedAt?: number;
  ranks: ServedRankStatus[];
  failure?: NodeFailure;
  /** Its checkpoint files changed since it was planned: how (each change described, and as data), and since when (ms since the epoch). */
  stale?: { changes: IdentityChange[]; described: string; since: number };
}

export interface NodeStatus {
  state: NodeState;
  nodeRank: number;
  nnodes: number;
  tpSize: number;
  localWorldSize: number;
  model: string;
  architecture?: string;
  fingerprint?: string;
  rankTable: RankTableEntry[];
  /**
   * Each local rank; clients and leases are its socket's counters, and serve its serving
   * lifecycle's state (src/serve/rankServiceMachine.ts), while it has a socket.
   */
  ranks: ServedRankStatus[];
  /** Every model version the node serves or loads, its own first (docs/operations.md, Several models). */
  models: ModelStatus[];
  /** Other nodes reported lost (or back) while serving. */
  peers: PeerStatus[];
  /** Every node of the group has reported ready. */
  groupReady: boolean;
  /** During rendezvous, once node 0 answered. */
  formation?: GroupFormation;
  /** On node 0 of a group: the rendezvous coordinator's state (src/machines/coordinator.ts). */
  coordinatorState?: string;
  /** The model registry's state, from the node's loading on (before it, the registry does not exist). */
  registryState?: RegistryState;
  /** With --keeper spawn or external: the keeper this node keeps its ranks' segments in. */
  keeper?: KeeperStatus;
  failure?: NodeFailure;
}

/**
 * The node's link to its keeper (src/keeper/keeperLink.ts). up: it answers and is watched;
 * absent: none answered, or the one that answered refused our WATCH (`reason` says; external:
 * the node retries); lost: the one watched died, and the node
 * starts another (spawn) or waits for one (external). The ranks then keep their segments again.
 */
export interface KeeperStatus {
  mode: 'spawn' | 'external';
  socket: string;
  state: 'starting' | 'up' | 'absent' | 'lost';
  pid?: number;
  /** When it entered this state (ms since the epoch). */
  since: number;
  /** Keepers this node started or found again after losing one. */
  reconnects: number;
  reason?: string;
}

/** How a node ended: stopped on request, or failed (with the cause). */
export interface NodeResult {
  state: 'stopped' | 'failed';
  failure?: NodeFailure;
}

export interface LoadResult {
  name: string;
  fingerprint: string;
  /** The same checkpoint at the same tp size was already loaded under this name: nothing was done. */
  alreadyLoaded: boolean;
  model: ModelStatus;
  /** The models unloaded to make room for it (an eviction policy: docs/operations.md, Eviction), least recently used first. */
  evicted: EvictedModel[];
}

/** A model an eviction policy unloaded to make room for a load. */
export interface EvictedModel {
  name: string;
  fingerprint: string;
  own: boolean;
  /** What its segments and processed layouts held, now freed. */
  bytes: number;
  /** Its last attach, or when it began serving (ModelStatus.lastUsedAt). */
  lastUsedAt?: number;
}

/** What a rollback did (docs/weight-updates.md): the version of `name` that is current now. */
export interface RollbackResult {
  name: string;
  version: number;
  fingerprint: string;
  /** It was current already: nothing changed. */
  alreadyCurrent: boolean;
}

export interface UnloadResult {
  /** The versions now draining (or freed, when no lease held them). */
  unloaded: Array<{ name: string; fingerprint: string; leases: number }>;
  force: boolean;
}
