// The serving protocol's messages (docs/protocol.md is the prose version of this file). The
// server validates every request against these schemas; the TypeScript client validates every
// response. Unknown keys are dropped, not refused, so a newer peer may add optional fields.
import { z } from 'zod';

/** Version of the message set; independent of the frame version in frameCodec.ts. */
export const PROTOCOL_VERSION = 1;

export const COMMANDS = ['ping', 'get_state', 'get_segment_fds', 'release', 'detach', 'stats', 'watch', 'begin_update', 'pull_tensors', 'open_pull_plan', 'pull_by_plan', 'commit_update', 'begin_publish', 'commit_publish', 'get_processed'] as const;
export type Command = (typeof COMMANDS)[number];

const requestId = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const hash = z.string().min(1).max(256);
const leaseId = z.string().min(1).max(64);
const count0 = z.number().int().min(0).max(2 ** 32 - 1);
/** A model's name (docs/operations.md, Several models): letters, digits and . _ - */
export const ModelName = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/, 'a model name is 1-128 letters, digits, dots, dashes and underscores, starting with a letter or digit');
export const ServeMode = z.enum(['map', 'copy']);
export type ServeMode = z.infer<typeof ServeMode>;

/**
 * Which model version a command that names none (ping, release, stats) is about: the one with
 * this rank fingerprint. Without it, the device's oldest model that still serves.
 */
const versionOf = hash.optional();

export const PingRequest = z.object({ id: requestId, cmd: z.literal('ping'), fingerprint: versionOf });
export const GetStateRequest = z.object({
  id: requestId,
  cmd: z.literal('get_state'),
  /** The client's expected fingerprint for this rank. */
  fingerprint: hash,
  /** The client's own pid, for the logs; the lease uses the kernel's SO_PEERCRED pid. */
  pid: z.number().int().min(1).max(2 ** 31 - 1),
  mode: ServeMode,
  /** Optional per-field hashes, so a mismatch reply can name the fields that differ. */
  fingerprintFields: z.record(z.string().min(1).max(64), hash).optional(),
  /** Free-form client name and version, for the logs. */
  client: z.string().max(200).optional(),
  /** Whose names and shapes the tensors come under (docs/protocol.md, Layouts); default `checkpoint`. */
  layout: z.string().min(1).max(64).optional(),
  /** The model's name: on a mismatch, the reply compares against its newest version on this device. */
  model: ModelName.optional(),
  /** true: the reply's tensors come as `columns` (docs/spec/manifest-columns.md), not as `tensors`. */
  columns: z.boolean().optional(),
  /** true: the reply's tensors come packed, in the frame after it (docs/spec/manifest-packed.md). Ask for `columns` too: a daemon older than packing sends those. */
  packed: z.boolean().optional(),
  /** true: the reply carries `content`, the rank's full-content fingerprint and every tensor's digest (docs/spec/fingerprint.md §8). */
  digests: z.boolean().optional(),
});
/** The descriptors of the segments a live lease of the caller's covers (host "fd" handles); the reply carries them as SCM_RIGHTS. */
/** `segments`: only these segments' descriptors (a switch between versions needs only those it does not map already). */
export const GetSegmentFdsRequest = z.object({ id: requestId, cmd: z.literal('get_segment_fds'), leaseId, segments: z.array(count0).max(1 << 20).optional() });
export const ReleaseRequest = z.object({ id: requestId, cmd: z.literal('release'), force: z.boolean().optional(), fingerprint: versionOf });
export const DetachRequest = z.object({ id: requestId, cmd: z.literal('detach'), leaseId: leaseId.optional() });
export const StatsRequest = z.object({ id: requestId, cmd: z.literal('stats'), fingerprint: versionOf });
/** Tells this connection, from now on, when a version of `model` is ready or about to be dropped (Events). */
/** `stale`: also hear model_stale (a client older than it would not know the event, so only those that ask hear it). */
export const WatchRequest = z.object({ id: requestId, cmd: z.literal('watch'), model: ModelName, stale: z.boolean().optional() });

/**
 * Asks to write a new version of `model` whose base is the version with rank fingerprint `base`
 * on this socket (docs/weight-updates.md): the reply carries writable copies of the base's
 * segments as SCM_RIGHTS. One update of a model at a time; it ends with commit_update, or with
 * this connection (then nothing of it is left).
 */
/**
 * `tensors`: the tensors the writer will write (absent: all). Only the segments holding them are
 * copied; every other segment of the new version is the base's own, shared (docs/weight-updates.md).
 */
export const BeginUpdateRequest = z.object({
  id: requestId,
  cmd: z.literal('begin_update'),
  model: ModelName,
  base: hash,
  tensors: z.array(z.string().min(1).max(1024)).min(1).max(1_000_000).optional(),
  /**
   * "staging" (the default): writable copies of the base's segments come with the reply.
   * "pull" (cuda, --cuda-handles fd): none come; the writer names its own tensors' memory with
   * pull_tensors, and the commit copies them straight into the version's final allocations.
   */
  source: z.enum(['staging', 'pull']).optional(),
  /** With "pull": the UUID of the GPU the writer's memory is on, which must be the rank's. */
  device: z.string().min(1).max(64).optional(),
  /**
   * With "pull": make the new version's final allocations now, for the segments holding `tensors`
   * (every segment without), so the pull's copies start at once (a trainer begins while it still
   * computes); the reply does not wait for them. A final no pull writes is freed at commit.
   */
  prepare: z.boolean().optional(),
});
/** A legacy CUDA IPC handle (CUipcMemHandle, 64 bytes) in canonical padded base64. */
const ipcHandle = z.string().regex(/^[A-Za-z0-9+/]{86}==$/, 'a CUDA IPC handle is 64 bytes in padded base64 (88 characters)');
/** A pulled tensor: its whole `bytes` at `offset` of the allocation behind its request's `sources[source]`. */
const pulledTensors = z
  .array(z.object({ name: z.string().min(1).max(1024), source: count0, offset: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER), bytes: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER) }))
  .min(1)
  .max(1_000_000);
/**
 * Names, for a pull update begun on this connection, where the writer's new bytes of some tensors
 * lie: each tensor's whole `bytes` at `offset` of the allocation behind `sources[source]` (its
 * process's cudaMalloc memory on the rank's GPU, as cuIpcGetMemHandle exports it). Sent once or
 * in several batches (each under the request size bound) before commit_update, which copies them.
 */
export const PullTensorsRequest = z.object({
  id: requestId,
  cmd: z.literal('pull_tensors'),
  update: leaseId,
  sources: z.array(ipcHandle).min(1).max(65_536),
  tensors: pulledTensors,
});
/**
 * Names, once, where a writer's tensors of `model` lie in its own GPU memory, as pull_tensors
 * does (docs/weight-updates.md, "Pull plans"): the daemon opens that memory and makes the copies'
 * and digests' resources now, and keeps them while this connection lives, for every update of
 * this process that pulls by the plan (pull_by_plan). The writer keeps the memory allocated.
 */
export const OpenPullPlanRequest = z.object({
  id: requestId,
  cmd: z.literal('open_pull_plan'),
  model: ModelName,
  device: z.string().min(1).max(64),
  sources: z.array(ipcHandle).min(1).max(65_536),
  tensors: pulledTensors,
  /** More parts of this plan follow (a plan of more tensors than one request holds): the daemon checks and keeps this one, and makes the plan at the last. */
  more: z.literal(true).optional(),
  /** The plan this part adds to: the first part's reply's `plan` (absent in the first part). */
  plan: leaseId.optional(),
});
/** For a pull update begun on this connection: the new bytes of the plan's tensors lie where the plan says (the writer checked that they still do). */
export const PullByPlanRequest = z.object({ id: requestId, cmd: z.literal('pull_by_plan'), update: leaseId, plan: leaseId });
/** Seals and digests what was written on this rank; the version serves once every local rank of the model committed. */
export const CommitUpdateRequest = z.object({ id: requestId, cmd: z.literal('commit_update'), update: leaseId });

/**
 * A processed layout's key (docs/spec/processed-key.md): `key` is its hash, which the daemon
 * compares; `keyFields` each field's value, which the daemon keeps and gives back so a client whose
 * key differs can say which part did.
 */
const processedKey = z.string().regex(/^[0-9a-f]{32}$/, 'a processed key is 32 lowercase hex digits (docs/spec/processed-key.md)');
const processedKeyFields = z.record(z.string().min(1).max(64), z.string().max(256)).refine((f) => Object.keys(f).length <= 32, { message: 'a processed key has at most 32 fields' });
/** A tensor to publish: its byte size is the dtype's times the shape's product. */
export const PublishTensor = z.object({ name: z.string().min(1).max(1024), dtype: z.string().min(1).max(32), shape: z.array(z.number().int().min(0).max(2 ** 40)).max(8) });
export type PublishTensor = z.infer<typeof PublishTensor>;
/**
 * Asks for fresh writable memory for what an engine computed from version `base` (a processed
 * layout, docs/engines.md): one segment holding `tensors`, sent as SCM_RIGHTS. It serves beside
 * the version, under `key`, once commit_publish sealed it; it ends with this connection otherwise.
 */
export const BeginPublishRequest = z.object({
  id: requestId,
  cmd: z.literal('begin_publish'),
  model: ModelName,
  base: hash,
  key: processedKey,
  keyFields: processedKeyFields,
  tensors: z.array(PublishTensor).min(1).max(1_000_000),
});
/** Seals and digests a publish; from then on get_processed with its key maps it. */
export const CommitPublishRequest = z.object({ id: requestId, cmd: z.literal('commit_publish'), publish: leaseId });
/** The processed layout `key` of version `fingerprint`, under a map lease on that version, its segments as SCM_RIGHTS; or what is published instead. */
export const GetProcessedRequest = z.object({ id: requestId, cmd: z.literal('get_processed'), fingerprint: hash, key: processedKey, pid: z.number().int().min(1).max(2 ** 31 - 1) });

export const Request = z.discriminatedUnion('cmd', [
  PingRequest, GetStateRequest, GetSegmentFdsRequest, ReleaseRequest, DetachRequest, StatsRequest, WatchRequest, BeginUpdateRequest, PullTensorsRequest, OpenPullPlanRequest, PullByPlanRequest, CommitUpdateRequest,
  BeginPublishRequest, CommitPublishRequest, GetProcessedRequest,
]);
export type Request = z.infer<typeof Request>;
export type RequestOf<C extends Command> = Extract<Request, { cmd: C }>;

export const ServeStatus = z.enum(['serving', 'draining', 'releasing', 'released']);
export type ServeStatus = z.infer<typeof ServeStatus>;

const count = z.number().int().min(0);

export const DeviceRef = z.object({
  uuid: z.string(),
  backend: z.enum(['host', 'cuda']),
  index: count,
  name: z.string(),
});
export type DeviceRef = z.infer<typeof DeviceRef>;
export const RankRef = z.object({
  globalRank: count,
  localRank: count,
  nodeRank: count,
  nnodes: z.number().int().min(1),
  tpSize: z.number().int().min(1),
});
export type RankRef = z.infer<typeof RankRef>;
export const TensorMeta = z.object({
  name: z.string(),
  dtype: z.string(),
  shape: z.array(count),
  segment: count,
  offset: count,
  bytes: count,
});
export type TensorMeta = z.infer<typeof TensorMeta>;
/** A manifest's tensors as one array per field (docs/spec/manifest-columns.md; tensorColumns.ts converts). */
export const TensorColumns = z.object({
  name: z.array(z.string()),
  /** The distinct dtypes; `dtype` holds an index into it per tensor. */
  dtypes: z.array(z.string()),
  dtype: z.array(count),
  /** The distinct shapes; `shape` holds an index into it per tensor. A rank has few. */
  shapes: z.array(z.array(count)),
  shape: z.array(count),
  segment: z.array(count),
  offset: z.array(count),
  bytes: z.array(count),
});
export type TensorColumns = z.infer<typeof TensorColumns>;
/**
 * handle: "fd" (host: a sealed memfd, sent by get_segment_fds) or the cuda backend's legacy IPC handle, base64.
 * memory: names the memory behind the segment (a memfd's inode, the daemon's name of a cuda-fd allocation):
 * two segments with the same name are the same allocation, so a client switching between versions that
 * share it keeps its mapping (issue 31). Absent where the daemon has no name (legacy IPC handles).
 */
export const SegmentRef = z.object({ segment: count, bytes: count, handle: z.string(), memory: z.string().optional() });
export type SegmentRef = z.infer<typeof SegmentRef>;
export const LeaseInfo = z.object({
  /** A hash of the lease id, never the id: the id proves ownership, so only its holder sees it. */
  leaseHash: z.string(),
  pid: count,
  mode: ServeMode,
  sinceMs: z.number(),
  /** Whether the lease ends with its connection (copy mode) or outlives it (map mode). */
  connectionBound: z.boolean(),
});
export type LeaseInfo = z.infer<typeof LeaseInfo>;
/** One model version this socket serves. */
export const ModelRef = z.object({
  name: z.string(),
  /** This rank's fingerprint of that version: what get_state takes. */
  fingerprint: z.string(),
  status: ServeStatus,
  globalRank: count,
  tpSize: z.number().int().min(1),
  /** Its number among its name's versions (docs/weight-updates.md); absent from older daemons. */
  version: count.optional(),
  /** Whether it is the version of its name clients are pointed to now (a retained one serves too); absent from older daemons. */
  current: z.boolean().optional(),
});
export type ModelRef = z.infer<typeof ModelRef>;

const ok = { id: requestId, ok: z.literal(true) };

export const PingReply = z.object({
  ...ok,
  status: ServeStatus,
  protocolVersion: z.number().int(),
  daemonPid: count,
  model: z.string(),
  architecture: z.string(),
  fingerprint: z.string(),
  device: DeviceRef,
  rank: RankRef,
  /** The layouts get_state can serve (absent from daemons before layouts: `checkpoint` only). */
  layouts: z.array(z.string()).optional(),
  /** The model's name (absent from daemons of one model). */
  name: z.string().optional(),
  /** Every model version on this socket, oldest first (absent from daemons of one model). */
  models: z.array(ModelRef).optional(),
});
export type PingReply = z.infer<typeof PingReply>;

/** get_state's reply as it comes off the wire: the tensors as objects or (asked for) as columns. */
export const StateReplyWire = z.object({
  ...ok,
  status: z.literal('ok'),
  mode: ServeMode,
  /** Pass to detach when done; every get_state that succeeds holds one. */
  leaseId,
  fingerprint: z.string(),
  backend: z.enum(['host', 'cuda']),
  device: DeviceRef,
  rank: RankRef,
  /** The layout the tensors are named and shaped by (absent from daemons before layouts: `checkpoint`). */
  layout: z.string().optional(),
  /** Exactly one of `tensors` and `columns`: columns when the request asked for them and the daemon knows them. */
  tensors: z.array(TensorMeta).optional(),
  columns: TensorColumns.optional(),
  /** Packed tensors (docs/spec/manifest-packed.md): on the wire the length of the frame that follows; the client puts that frame's payload here. */
  packed: z.union([count, z.instanceof(Uint8Array)]).optional(),
  /** alias name -> the tensor whose bytes it shares (tied weights). */
  aliases: z.record(z.string(), z.string()),
  segments: z.array(SegmentRef),
  /** Asked for (`digests: true`) and known: the rank's full-content fingerprint and every checkpoint tensor's digest (docs/spec/fingerprint.md §8). */
  content: z.object({ fingerprint: z.string(), digests: z.record(z.string(), z.string()) }).optional(),
}).refine((r) => [r.tensors, r.columns, r.packed].filter((f) => f !== undefined).length === 1, { message: 'a manifest has exactly one of "tensors", "columns" and "packed"' });
/** get_state's reply as the client hands it on: the tensors as objects, whichever form came. */
export type StateReply = Omit<z.infer<typeof StateReplyWire>, 'tensors' | 'columns' | 'packed'> & { tensors: TensorMeta[] };

export const MismatchReply = z.object({
  ...ok,
  status: z.literal('mismatch'),
  /** Names of the fingerprint fields that differ; ["fingerprint"] when no field hashes were sent. */
  fields: z.array(z.string()),
  fingerprint: z.string(),
  fingerprintFields: z.record(z.string(), z.string()),
  /** Every model version on this socket (absent from daemons of one model): the client may ask for one of those. */
  models: z.array(ModelRef).optional(),
});
export type MismatchReply = z.infer<typeof MismatchReply>;

export const GetStateReplyWire = z.discriminatedUnion('status', [StateReplyWire, MismatchReply]);
export type GetStateReply = StateReply | MismatchReply;

/**
 * The segment numbers of the descriptors attached to this reply, in the order they were sent: the
 * i-th descriptor received is segment segments[i]. Each is a memfd sealed against write, shrink
 * and grow; the receiver owns (and closes) them.
 */
export const GetSegmentFdsReply = z.object({ ...ok, segments: z.array(count) });
export type GetSegmentFdsReply = z.infer<typeof GetSegmentFdsReply>;

export const ReleaseReply = z.object({
  ...ok,
  /** True when an earlier release had already freed the memory. */
  alreadyReleased: z.boolean(),
  /** Other clients' leases ended by a forced release. */
  revoked: z.array(LeaseInfo),
});
export type ReleaseReply = z.infer<typeof ReleaseReply>;

export const DetachReply = z.object({ ...ok, dropped: count });
export type DetachReply = z.infer<typeof DetachReply>;

/**
 * A processed layout served beside a version's rank (docs/engines.md, "Publishing what the engine
 * computed"), as stats and the node's status report it: its key, the rank fingerprint of the
 * version it serves beside, its bytes, the get_processed leases on it (engines that map it now),
 * when it was committed and when an engine last mapped it (ms since the epoch).
 */
export const ProcessedLayoutStatus = z.object({ key: z.string(), base: z.string(), bytes: count, leases: count, publishedAt: z.number(), lastMappedAt: z.number().optional() });
export type ProcessedLayoutStatus = z.infer<typeof ProcessedLayoutStatus>;

export const StatsReply = z.object({
  ...ok,
  status: ServeStatus,
  connections: count,
  leases: z.array(LeaseInfo),
  requests: count,
  protocolErrors: count,
  refusedPeers: count,
  uptimeSeconds: z.number(),
  /** Bytes of this rank's segments held on the device; 0 once released (absent from older daemons). */
  deviceBytes: count.optional(),
  /** The processed layouts engines published beside this rank (absent from older daemons). */
  processed: z.array(ProcessedLayoutStatus).optional(),
  /** Bytes of everything the daemon holds on this device: every version not released, each memory once, and the processed layouts (absent from older daemons). */
  heldBytes: count.optional(),
});
export type StatsReply = z.infer<typeof StatsReply>;

export const WatchReply = z.object({
  ...ok,
  /** Every name this connection watches now. */
  watching: z.array(z.string()),
  /** The versions of the watched model on this socket now, oldest first. */
  versions: z.array(ModelRef),
});
export type WatchReply = z.infer<typeof WatchReply>;

export const BeginUpdateReply = z.object({
  ...ok,
  /** Names this update in commit_update; only on the connection that began it. */
  update: z.string(),
  model: z.string(),
  /** The base version's rank fingerprint. */
  base: z.string(),
  /** The device the rank serves from: a cuda writer maps its segments there (docs/weight-updates.md, "cuda"). */
  device: DeviceRef,
  /**
   * The copied segments (those holding a tensor to write), in the order of the descriptors that
   * come with the reply: handle "fd" (host: writable memfds) or "cuda-fd" (cuda: staging VMM
   * allocations, which the writer imports and maps read-write).
   */
  segments: z.array(SegmentRef),
  /**
   * The tensors the writer may write (those it named, or all), as get_state's; `segment` is a
   * number of `segments`. `piece`, on a tensor this rank holds a tensor-parallel piece of: the
   * whole tensor's shape and the regions of its bytes (C order) that make the piece, in order,
   * each `rows` rows of `rowBytes` bytes `srcPitch` apart from `srcOffset`.
   */
  tensors: z.array(TensorMeta.extend({ piece: z.object({ fullShape: z.array(count), regions: z.array(z.object({ srcOffset: count, rows: count, rowBytes: count, srcPitch: count })) }).optional() })),
});
export type BeginUpdateReply = z.infer<typeof BeginUpdateReply>;

export const PullTensorsReply = z.object({
  ...ok,
  /** How many tensors of this rank the update pulls so far (this request's included). */
  pulled: count,
  /** How many tensors the rank's checkpoint layout holds (a full update pulls every one). */
  tensors: count,
});
export type PullTensorsReply = z.infer<typeof PullTensorsReply>;

const openPullPlanNamed = {
  ...ok,
  /** The plan's number, for pull_by_plan on any connection of this process (and for its next part). */
  plan: z.string(),
  model: z.string(),
  /** How many tensors and sources (allocations) it names (with every part so far). */
  tensors: count,
  sources: count,
};
export const OpenPullPlanReply = z.union([
  z.object({
    ...openPullPlanNamed,
    /** Why its updates hash their digests on the CPU though the rank hashes on the GPU ("" where not). */
    gpuDigestUnavailable: z.string(),
    /** The native work done once: opening the writer's memory, the digest kernel's resources (ms). */
    timings: z.object({ openMs: z.number(), setupMs: z.number(), moduleMs: z.number(), nativeMs: z.number() }),
  }),
  /** A part sent with `more`: checked and kept; the plan is made at its last part. */
  z.object({ ...openPullPlanNamed, pending: z.literal(true) }),
]);
export type OpenPullPlanReply = z.infer<typeof OpenPullPlanReply>;

export const CommitUpdateReply = z.object({
  ...ok,
  model: z.string(),
  /** The local ranks (global rank numbers) that have not committed yet; empty once the version serves. */
  waiting: z.array(count),
  /** Once the version serves: its number, the model's fingerprint and this rank's. */
  version: count.optional(),
  modelFingerprint: z.string().optional(),
  fingerprint: z.string().optional(),
});
export type CommitUpdateReply = z.infer<typeof CommitUpdateReply>;

export const BeginPublishReply = z.object({
  ...ok,
  /** Names this publish in commit_publish; only on the connection that began it. */
  publish: z.string(),
  model: z.string(),
  base: z.string(),
  key: z.string(),
  /** The rank's device: on cuda, where the writer maps the segment. */
  device: DeviceRef,
  /** The fresh segments (one), in the order of the descriptors that come with the reply (host: writable memfds, zero; cuda: staging allocations). */
  segments: z.array(SegmentRef),
  /** Where each tensor asked for lies, in the order asked. */
  tensors: z.array(TensorMeta),
});
export type BeginPublishReply = z.infer<typeof BeginPublishReply>;

export const CommitPublishReply = z.object({ ...ok, model: z.string(), base: z.string(), key: z.string(), bytes: count });
export type CommitPublishReply = z.infer<typeof CommitPublishReply>;

/** One processed layout a version serves: its key and fields, for a client whose key differs. */
export const ProcessedRef = z.object({ key: z.string(), keyFields: z.record(z.string(), z.string()), bytes: count });
export type ProcessedRef = z.infer<typeof ProcessedRef>;

/**
 * get_processed: `found` with a map lease on the base version (detach it when done) and the
 * layout's manifest, its segments' descriptors (sealed read-only memfds) with the reply in
 * `segments`' order; `absent` with the layouts the version serves instead.
 */
export const GetProcessedReply = z.discriminatedUnion('status', [
  z.object({ ...ok, status: z.literal('found'), leaseId, fingerprint: z.string(), key: z.string(), backend: z.enum(['host', 'cuda']), device: DeviceRef, segments: z.array(SegmentRef), tensors: z.array(TensorMeta) }),
  z.object({ ...ok, status: z.literal('absent'), fingerprint: z.string(), key: z.string(), published: z.array(ProcessedRef) }),
]);
export type GetProcessedReply = z.infer<typeof GetProcessedReply>;

/**
 * A frame no request asked for (id null, ok true): something happened to a model this connection
 * watches, or to a lease it holds. model_ready: `fingerprint` of a newer version of `model` is
 * attachable. model_dropping: version `fingerprint` takes no new lease and is freed once its
 * leases end (`newer`: the version to move to, when there is one). lease_revoked: a forced unload
 * ended this connection's lease `leaseHash` of version `fingerprint`; its memory is being freed.
 * model_stale (to watches that asked for it): version `fingerprint`'s checkpoint files changed
 * since it was loaded (`files`: each change); it takes no new lease, and weightd loads it again.
 */
export const ModelEvent = z.object({
  id: z.null(),
  ok: z.literal(true),
  event: z.enum(['model_ready', 'model_dropping', 'lease_revoked', 'model_stale']),
  model: z.string(),
  fingerprint: z.string(),
  newer: z.string().optional(),
  /** The version's number among its name's (docs/weight-updates.md). */
  version: count.optional(),
  leaseHash: z.string().optional(),
  files: z.array(z.string()).optional(),
});
export type ModelEvent = z.infer<typeof ModelEvent>;

export const ErrorReply = z.object({
  id: requestId.nullable(),
  ok: z.literal(false),
  error: z.object({ code: z.string(), message: z.string(), details: z.record(z.string(), z.unknown()).optional() }),
});
export type ErrorReply = z.infer<typeof ErrorReply>;

/** The reply schema of each command, for the client. */
export const REPLY_SCHEMAS = {
  ping: PingReply,
  get_state: GetStateReplyWire,
  get_segment_fds: GetSegmentFdsReply,
  release: ReleaseReply,
  detach: DetachReply,
  stats: StatsReply,
  watch: WatchReply,
  begin_update: BeginUpdateReply,
  pull_tensors: PullTensorsReply,
  open_pull_plan: OpenPullPlanReply,
  pull_by_plan: PullTensorsReply,
  commit_update: CommitUpdateReply,
  begin_publish: BeginPublishReply,
  commit_publish: CommitPublishReply,
  get_processed: GetProcessedReply,
} as const satisfies Record<Command, z.ZodType>;
