// The node's status as published over HTTP (/status, /events) and for monitoring: plain JSON,
// with load rates and ETAs worked out, and nothing that must stay on the node. Segment exports
// (CUDA IPC handles) and error stacks are left out: the HTTP port may be reachable by users the
// 0600 sockets keep out.
import type { IdentityChange } from '../files/fileIdentity.js';
import type { ModelState, ModelStatus, NodeStatus, RankState, ServedRankStatus } from '../nodeStatus.js';
import type { RankTableEntry } from '../wire/rankTable.js';
import type { ServeStatus } from '../wire/protocol.js';
import { nodeProgress, rankProgress, type LoadProgress } from './loadProgress.js';

export interface RankView extends LoadProgress {
  localRank: number;
  globalRank: number;
  state: RankState;
  /** freeBytes: null while not probed yet (a cuda rank adopted with no CUDA context, until its descriptors' check makes one). */
  device: { backend: string; index: number; uuid: string; name: string; totalBytes: number; freeBytes: number | null } | null;
  socketPath: string | null;
  /** Client connections and leases on the rank's socket; null while it has no socket (not yet serving, or closed). */
  clients: number | null;
  leases: number | null;
  /** The serving lifecycle's state (src/serve/rankServiceMachine.ts); null while it has no socket. */
  serve: ServeStatus | null;
  /** Once resident: `checkpoint` (read from disk) or `keeper` (adopted); null before. */
  source: 'checkpoint' | 'keeper' | 'writer' | null;
  /** Adopted: when its segments were first kept (ISO time) and their age when adopted. */
  keptAt: string | null;
  keptAgeMs: number | null;
  /** Adopted: on the main thread, with no worker thread and no device context (a restart's fast path, src/actors/adoptHere.ts), or on its worker thread. */
  adoptedOn: 'main' | 'worker' | null;
  /** With a keeper: whether it holds this rank's segments now; null without one or before loading. */
  kept: boolean | null;
  keptReason: string | null;
  /** Loaded from the checkpoint although the keeper held its shard: why that shard was refused (its files changed, ...); null otherwise. */
  notAdopted: string | null;
  /** The processed layouts engines published beside it (docs/engines.md); null while it has no socket. */
  processed: ProcessedLayoutView[] | null;
  /**
   * Adopted descriptors checked after READY (a cuda rank adopted with no CUDA context): 'checking'
   * (no client gets them yet), 'checked', or 'refused' (the rank fails); null where every check
   * ran before the rank was loaded.
   */
  descriptors: 'checking' | 'checked' | 'refused' | null;
  /** While loading: waits for the node's other ranks of its model (a fill group), so its bytes do not move. */
  waitingForGroup: boolean;
}

/** A processed layout beside a rank: its key, bytes, the engines that map it now (leases), when it was published and last mapped (ISO time). */
export interface ProcessedLayoutView {
  key: string;
  bytes: number;
  leases: number;
  publishedAt: string;
  lastMappedAt: string | null;
}

/** One model version the node serves or loads (docs/operations.md, Several models). */
export interface ModelView {
  name: string;
  own: boolean;
  state: ModelState;
  model: string;
  fingerprint: string | null;
  tpSize: number;
  /** Its number among its name's versions, and whether clients are pointed to it (docs/weight-updates.md). */
  version: number;
  current: boolean;
  bytes: number;
  /** Bytes of the processed layouts beside its ranks (each rank's `processed`), held besides `bytes`. */
  processedBytes: number;
  leases: number;
  /** Its last attach, or when it began serving (ISO time; what --evict no-lease-lru orders by); null until it serves. */
  lastUsedAt: string | null;
  ranks: RankView[];
  failure: { code: string; message: string } | null;
  /** Its checkpoint files changed since it was loaded: each change (docs/spec/file-identity.md) and when it was found; null while unchanged. */
  stale: { files: string; changes: IdentityChange[]; since: string } | null;
}

export interface PeerView {
  nodeRank: number;
  hostName: string | null;
  /** up: in the group and not reported lost since it formed. */
  state: 'up' | 'lost';
  reason: string | null;
  /** When it was last reported lost or back (ISO time); null if never. */
  since: string | null;
}

export interface StatusView {
  time: string;
  pid: number;
  state: NodeStatus['state'];
  /** What /healthz and weightd_node_ready report (serves() below). */
  ready: boolean;
  nodeRank: number;
  nnodes: number;
  tpSize: number;
  localWorldSize: number;
  model: string;
  architecture: string | null;
  fingerprint: string | null;
  groupReady: boolean;
  /** The node's local ranks together. */
  load: LoadProgress;
  /** The node's own model's ranks. */
  ranks: RankView[];
  /** Every model version, the node's own first, each with its ranks, bytes and leases. */
  models: ModelView[];
  rankTable: RankTableEntry[];
  /** The other nodes of the group once it formed (empty for a single node, and until then). */
  peers: PeerView[];
  /** While in rendezvous, once node 0 answered: the node ranks that joined and those missing. */
  formation: { joined: number[]; missing: number[] } | null;
  /** On node 0 of a group: the rendezvous coordinator's state ("gathering", "failed.informing"...). */
  coordinatorState: string | null;
  /** The model registry's state ("startup", "running"...; src/models/modelRegistryMachine.ts); null before the node's loading. */
  registryState: string | null;
  /** The keeper (--keeper spawn|external); null with --keeper off. */
  keeper: { mode: string; socket: string; state: string; pid: number | null; since: string; reconnects: number; reason: string | null } | null;
  failure: { name: string; code: string; message: string; localRank: number | null; globalRank: number | null } | null;
}

/**
 * Whether the node serves what it was started for: it is ready, and a version of its own model
 * (the one --model named first, or a newer version of that name that took its place) serves on
 * every one of its ranks. Other models do not count: they come and go with `ctl load` and
 * `unload`, and each has its state in `models`. So `ctl unload` of the own model, its eviction, or
 * a client's `release` of one of its ranks makes the node not ready, until a version of that name
 * serves again.
 */
export function serves(s: NodeStatus): boolean {
  return s.state === 'ready' && ownVersions(s).some(servesOnEveryRank);
}

/** The state of the own model's name once the node is ready: of the version that serves, else of the newest. */
export function ownModelState(s: NodeStatus): ModelState | undefined {
  if (s.state !== 'ready') return undefined;
  const versions = ownVersions(s);
  return (versions.find(servesOnEveryRank) ?? versions.at(-1))?.state;
}

function ownVersions(s: NodeStatus): ModelStatus[] {
  const name = s.models.find((m) => m.own)?.name;
  return s.models.filter((m) => m.name === name);
}

/** A stale version refuses get_state. A rank with no socket known (a status taken without the servers) counts by its own state. */
function servesOnEveryRank(m: ModelStatus): boolean {
  return m.state === 'serving' && !m.stale && m.ranks.length > 0 && m.ranks.every((r) => r.state === 'serving' && (r.serve ?? 'serving') === 'serving');
}

export function toStatusView(s: NodeStatus): StatusView {
  const reported = new Map(s.peers.map((p) => [p.nodeRank, p]));
  const hosts = new Map(s.rankTable.map((e) => [e.nodeRank, e.hostName]));
  const peers: PeerView[] = [...hosts.keys()]
    .filter((n) => n !== s.nodeRank)
    .map((nodeRank) => {
      const p = reported.get(nodeRank);
      return {
        nodeRank,
        hostName: hosts.get(nodeRank) ?? null,
        state: p?.state ?? 'up',
        reason: p?.reason ?? null,
        since: p ? new Date(p.since).toISOString() : null,
      };
    });
  return {
    time: new Date().toISOString(),
    pid: process.pid,
    state: s.state,
    ready: serves(s),
    nodeRank: s.nodeRank,
    nnodes: s.nnodes,
    tpSize: s.tpSize,
    localWorldSize: s.localWorldSize,
    model: s.model,
    architecture: s.architecture ?? null,
    fingerprint: s.fingerprint ?? null,
    groupReady: s.groupReady,
    load: nodeProgress(s.ranks),
    ranks: s.ranks.map(rankView),
    models: s.models.map((m) => ({
      name: m.name,
      own: m.own,
      state: m.state,
      model: m.model,
      fingerprint: m.fingerprint ?? null,
      tpSize: m.tpSize,
      version: m.version,
      current: m.current,
      bytes: m.bytes,
      processedBytes: m.processedBytes,
      leases: m.leases,
      lastUsedAt: m.lastUsedAt === undefined ? null : new Date(m.lastUsedAt).toISOString(),
      ranks: m.ranks.map(rankView),
      failure: m.failure ? { code: m.failure.code, message: m.failure.message } : null,
      stale: m.stale ? { files: m.stale.described, changes: m.stale.changes, since: new Date(m.stale.since).toISOString() } : null,
    })),
    rankTable: s.rankTable,
    peers,
    formation: s.state === 'rendezvous' && s.formation ? s.formation : null,
    coordinatorState: s.coordinatorState ?? null,
    registryState: s.registryState ?? null,
    keeper: s.keeper
      ? { mode: s.keeper.mode, socket: s.keeper.socket, state: s.keeper.state, pid: s.keeper.pid ?? null, since: new Date(s.keeper.since).toISOString(), reconnects: s.keeper.reconnects, reason: s.keeper.reason ?? null }
      : null,
    failure: s.failure
      ? { name: s.failure.name, code: s.failure.code, message: s.failure.message, localRank: s.failure.localRank ?? null, globalRank: s.failure.globalRank ?? null }
      : null,
  };
}

function rankView(r: ServedRankStatus): RankView {
  return {
    localRank: r.localRank,
    globalRank: r.globalRank,
    state: r.state,
    device: r.device
      ? { backend: r.device.backend, index: r.device.index, uuid: r.device.uuid, name: r.device.name, totalBytes: r.device.totalBytes, freeBytes: r.device.freeProbed === false ? null : r.device.freeBytes }
      : null,
    socketPath: r.socketPath ?? null,
    ...rankProgress(r),
    clients: r.clients ?? null,
    leases: r.leases ?? null,
    serve: r.serve ?? null,
    source: r.source?.from ?? null,
    keptAt: r.source?.from === 'keeper' ? r.source.keptAt : null,
    keptAgeMs: r.source?.from === 'keeper' ? r.source.ageMs : null,
    adoptedOn: r.source?.from === 'keeper' || r.source?.from === 'writer' ? r.source.thread : null,
    kept: r.kept ?? null,
    keptReason: r.keptReason ?? null,
    notAdopted: r.source?.from === 'checkpoint' ? (r.source.refused ?? null) : null,
    processed:
      r.processed?.map((p) => ({
        key: p.key,
        bytes: p.bytes,
        leases: p.leases,
        publishedAt: new Date(p.publishedAt).toISOString(),
        lastMappedAt: p.lastMappedAt === undefined ? null : new Date(p.lastMappedAt).toISOString(),
      })) ?? null,
    descriptors: r.descriptors ?? null,
    waitingForGroup: r.waitingForGroup === true && r.state === 'loading',
  };
}
