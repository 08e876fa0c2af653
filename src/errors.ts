// Every error weightd raises carries a stable `code` (for programs and tests) and a message
// that names the value at fault and what to do about it (for people).

/** The codes the addon raises (native/*.cpp); test/native/nativeErrors.test.ts holds this list to the C++ source. */
export const NATIVE_ERROR_CODES = [
  'E_ADOPTED', 'E_ALREADY_ALLOCATED', 'E_BAD_ADOPT', 'E_BAD_BACKEND', 'E_BAD_GROUP', 'E_BAD_HANDLE', 'E_BAD_OPTION', 'E_BAD_PLAN',
  'E_BAD_SEGMENT_FD', 'E_CLOSED', 'E_CUDA', 'E_CUDA_HANDLES_UNSUPPORTED', 'E_CUDA_UNAVAILABLE', 'E_DEVICE_BUSY', 'E_DEVICE_MISMATCH',
  'E_FILE_CHANGED', 'E_FILE_NOT_REGULAR', 'E_FILE_OPEN', 'E_FILE_READ', 'E_FILE_TRUNCATED', 'E_FILL_CANCELLED', 'E_FILL_RUNNING',
  'E_INTERNAL', 'E_NOT_ALLOCATED', 'E_NOT_OPEN', 'E_NO_DEVICE', 'E_NO_FILL', 'E_OUT_OF_MEMORY', 'E_OUT_OF_RANGE',
  'E_PEERCRED', 'E_SEALED', 'E_SHM_CREATE', 'E_SHM_MAP', 'E_SHM_OPEN', 'E_SHM_SEAL', 'E_SHM_WRITE', 'E_THREAD_CREATE', 'E_UPDATE_MAPPED', 'E_UPDATE_SIZE',
  'E_UPDATE_SOURCE',
  // native/unix_fds.cpp: descriptor passing
  'E_CONNECT', 'E_FD_CLOSE', 'E_FD_OPEN', 'E_FD_RECV', 'E_FD_SEND', 'E_FD_TIMEOUT', 'E_FRAME_TOO_LARGE', 'E_PEER_CLOSED', 'E_PEER_UID',
  // native/unread_bytes.cpp: what a connection's peer has not read
  'E_SOCKET_QUEUE',
] as const;

export type NativeErrorCode = (typeof NATIVE_ERROR_CODES)[number];

/** Every code weightd raises: a code not listed here (a typo) does not compile. Codes are stable: tests, docs and clients name them. */
export type ErrorCode =
  | NativeErrorCode
  | 'E_ADDON_LOAD'
  | 'E_ADOPT_CHECK_FAILED'
  | 'E_BAD_MAGIC'
  | 'E_BAD_MANIFEST'
  | 'E_BAD_REPLY'
  | 'E_BAD_REQUEST'
  | 'E_BAD_VERSION'
  | 'E_CKPT_CONFIG'
  | 'E_CKPT_DIR'
  | 'E_CKPT_DUPLICATE_TENSOR'
  | 'E_CKPT_FUSED_SHAPE'
  | 'E_CKPT_INDEX_BAD_PATH'
  | 'E_CKPT_INDEX_DUPLICATE'
  | 'E_CKPT_INDEX_JSON'
  | 'E_CKPT_INDEX_MISSING_FILE'
  | 'E_CKPT_INDEX_MISSING_TENSOR'
  | 'E_CKPT_INDEX_READ'
  | 'E_CKPT_INDEX_SCHEMA'
  | 'E_CKPT_INDEX_UNLISTED_TENSOR'
  | 'E_CKPT_INDEX_WRONG_FILE'
  | 'E_CKPT_MISSING_TENSOR'
  | 'E_CKPT_NO_CONFIG'
  | 'E_CKPT_NO_WEIGHTS'
  | 'E_CKPT_UNLISTED_FILE'
  | 'E_DEVICE_COUNT'
  | 'E_DEVICE_LOCKED'
  | 'E_DISCONNECTED'
  | 'E_DOES_NOT_FIT'
  | 'E_DRAINING'
  | 'E_EVENTS_NOT_READ'
  | 'E_FAILED'
  | 'E_FD_LIMIT'
  | 'E_FILE_TOO_LARGE'
  | 'E_FRAME_JSON'
  | 'E_FRAME_MAGIC'
  | 'E_FRAME_VERSION'
  | 'E_ILLEGAL_TRANSITION'
  | 'E_INSPECT_BIND'
  | 'E_KEEPER_FDS'
  | 'E_KEEPER_FULL'
  | 'E_KEEPER_NOT_FOUND'
  | 'E_KEEPER_REPLY'
  | 'E_KEEPER_START'
  | 'E_KEEPER_STOP'
  | 'E_LAYOUT_ARCHITECTURE'
  | 'E_LAYOUT_COMBINATION'
  | 'E_LAYOUT_INCOMPLETE'
  | 'E_LAYOUT_MEMBER_SHAPE'
  | 'E_LAYOUT_NOT_SERVED'
  | 'E_LAYOUT_SCALE_BLOCKS'
  | 'E_LAYOUT_UNKNOWN'
  | 'E_LAYOUT_UNKNOWN_TENSOR'
  | 'E_LEASE_HELD'
  | 'E_LOAD_BUSY'
  | 'E_LOCK'
  | 'E_LOCK_CORRUPT'
  | 'E_MODEL_GROUP_COORDINATOR_LOST'
  | 'E_MODEL_GROUP_MISMATCH'
  | 'E_MODEL_GROUP_NOT_READY'
  | 'E_MODEL_GROUP_PEER_FAILED'
  | 'E_MODEL_GROUP_PEER_LOST'
  | 'E_MODEL_GROUP_TIMEOUT'
  | 'E_MODEL_PLACEMENT'
  | 'E_NODE_MANIFEST'
  | 'E_NOT_KEPT'
  | 'E_NO_CONTROL'
  | 'E_NO_CUDA'
  | 'E_NO_FDS'
  | 'E_NO_KEEPER'
  | 'E_NO_LEASE'
  | 'E_NO_SEGMENT_FDS'
  | 'E_NO_SOCKET'
  | 'E_NO_PUBLISH'
  | 'E_NO_PULL_PLAN'
  | 'E_NO_UPDATE'
  | 'E_PEER'
  | 'E_PLAN_BAD_REGEX'
  | 'E_PLAN_JSON'
  | 'E_PLAN_READ'
  | 'E_PLAN_SCHEMA'
  | 'E_PLATFORM'
  | 'E_PUBLISHED'
  | 'E_TOO_MANY_PUBLISHED'
  | 'E_TOO_MANY_PULL_PLANS'
  | 'E_RANK_EXIT'
  | 'E_RATE_LIMITED'
  | 'E_RDZV_COORDINATOR_LOST'
  | 'E_RDZV_DEVICE_COUNT'
  | 'E_RDZV_CONTENT_DIFFERS'
  | 'E_RDZV_DUPLICATE_DEVICE'
  | 'E_RDZV_DUPLICATE_NODE_RANK'
  | 'E_RDZV_FINGERPRINT_MISMATCH'
  | 'E_RDZV_FRAME_TOO_LARGE'
  | 'E_RDZV_LISTEN'
  | 'E_RDZV_LOCAL_WORLD_SIZE_MISMATCH'
  | 'E_RDZV_NNODES_MISMATCH'
  | 'E_RDZV_NODE_RANK_RANGE'
  | 'E_RDZV_NOT_WEIGHTD'
  | 'E_RDZV_PEER_FAILED'
  | 'E_RDZV_PEER_LOST'
  | 'E_RDZV_PROTOCOL'
  | 'E_RDZV_SCHEMA'
  | 'E_RDZV_TIMEOUT'
  | 'E_RDZV_TOKEN'
  | 'E_RDZV_TP_MISMATCH'
  | 'E_RDZV_VERSION_MISMATCH'
  | 'E_READ_TIMEOUT'
  | 'E_RELEASED'
  | 'E_RELEASE_FAILED'
  | 'E_RELEASING'
  | 'E_SEGMENT_TOO_LARGE'
  | 'E_SERVE_CLOSED'
  | 'E_SHARD_BAD_DIM'
  | 'E_SHARD_FUSED_PARTS'
  | 'E_SHARD_HEADS'
  | 'E_SHARD_INDIVISIBLE'
  | 'E_SHARD_KV_HEADS'
  | 'E_SHARD_SUBBYTE'
  | 'E_SHARD_TP_SIZE'
  | 'E_SHARD_UNPLACED'
  | 'E_SOCKET_BIND'
  | 'E_SOCKET_DIR'
  | 'E_SOCKET_DIR_ANCESTOR'
  | 'E_SOCKET_DIR_MODE'
  | 'E_SOCKET_DIR_NOT_DIR'
  | 'E_SOCKET_DIR_OWNER'
  | 'E_SOCKET_DIR_SYMLINK'
  | 'E_SOCKET_IN_USE'
  | 'E_SOCKET_PATH'
  | 'E_SOCKET_PATH_TOO_LONG'
  | 'E_STALE'
  | 'E_STOPPED'
  | 'E_STOP_GRACE'
  | 'E_STOP_TIMEOUT'
  | 'E_ST_BAD_ENTRY'
  | 'E_ST_BAD_METADATA'
  | 'E_ST_BAD_OFFSETS'
  | 'E_ST_BAD_SHAPE'
  | 'E_ST_DATA_TRUNCATED'
  | 'E_ST_DUPLICATE_KEY'
  | 'E_ST_DUPLICATE_TENSOR'
  | 'E_ST_HEADER_JSON'
  | 'E_ST_HEADER_NOT_OBJECT'
  | 'E_ST_HEADER_TOO_LARGE'
  | 'E_ST_HEADER_TRUNCATED'
  | 'E_ST_HEADER_UTF8'
  | 'E_ST_IO'
  | 'E_ST_MISALIGNED'
  | 'E_ST_OFFSETS'
  | 'E_ST_OVERFLOW'
  | 'E_ST_SIZE_MISMATCH'
  | 'E_ST_TOO_SMALL'
  | 'E_ST_TRAILING_BYTES'
  | 'E_ST_UNKNOWN_DTYPE'
  | 'E_ST_WRITE_NAME'
  | 'E_ST_WRITE_SIZE'
  | 'E_TIMEOUT'
  | 'E_TOO_MANY_CONNECTIONS'
  | 'E_TOO_MANY_FDS'
  | 'E_TOO_MANY_LEASES'
  | 'E_TOO_MANY_WATCHERS'
  | 'E_TOO_MANY_WATCHES'
  | 'E_UNEXPECTED_FDS'
  | 'E_UNKNOWN_COMMAND'
  | 'E_UNKNOWN_DTYPE'
  | 'E_UNKNOWN_LAYOUT'
  | 'E_UNKNOWN_MODEL'
  | 'E_UNKNOWN_OP'
  | 'E_UNKNOWN_TENSOR'
  | 'E_UNKNOWN_VERSION'
  | 'E_UPDATE_ABORTED'
  | 'E_UPDATE_BASE'
  | 'E_UPDATE_BUSY'
  | 'E_UPDATE_REPLICAS'
  | 'E_UPDATE_UNSUPPORTED'
  | 'E_VERSION_NOT_KEPT'

  | 'E_USAGE';

/**
 * A code as another thread or process sent it, taken as sent: a peer of another version may send
 * one this build does not list, and a Node error's code (ENOENT) crosses a worker boundary too.
 */
export function receivedCode(code: string): ErrorCode {
  return code as ErrorCode;
}

export class WeightdError extends Error {
  readonly code: ErrorCode;
  readonly details: Record<string, unknown>;
  constructor(code: ErrorCode, message: string, details: Record<string, unknown> = {}, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.details = details;
  }
}

/** What a request handler threw, as the error its reply carries: a bug's message, never a stack. */
export function asWeightdError(err: unknown): WeightdError {
  return err instanceof WeightdError ? err : new WeightdError('E_INTERNAL', `internal error: ${(err as Error).message}`);
}

/** `text`, or its first `n` characters and how many it had: a peer's own text in an error or a log line is never echoed whole. */
export function clipText(text: string, n: number): string {
  return text.length > n ? `${text.slice(0, n)}… (${text.length} characters)` : text;
}

/** A schema's first few complaints about a value, for an error message: `path: message; ...`. */
export function schemaIssues(issues: ReadonlyArray<{ path: ReadonlyArray<PropertyKey>; message: string }>): string {
  // Clipped: a path or a message can carry a peer's own text (a key of 900 KB).
  const shown = issues
    .slice(0, 5)
    .map((i) => `${clipText(i.path.map(String).join('.') || '(root)', 120)}: ${clipText(i.message, 200)}`)
    .join('; ');
  return issues.length > 5 ? `${shown}; and ${issues.length - 5} more` : shown;
}

/** A bad command-line flag or start option. The CLI exits with code 2 for these. */
export class UsageError extends WeightdError {}

/** A checkpoint file, index or config that breaks a rule; names the file and tensor. */
export class CheckpointError extends WeightdError {}

/** A tensor that cannot be divided across the tensor-parallel ranks as asked. */
export class ShardingError extends WeightdError {}

/** A failure of the device backend (CUDA or host shared memory), raised by the addon. */
export class DeviceError extends WeightdError {}

/** A rank actor that failed or exited; names the rank and the cause. */
export class RankFailedError extends WeightdError {}

/** Multi-node rendezvous: a rejected join, a missing node, a lost coordinator. */
export class RendezvousError extends WeightdError {}

/** A malformed, oversized or unexpected frame on a socket. */
export class ProtocolError extends WeightdError {}

/** Socket directory, lock or peer-credential problems while serving. */
export class ServeError extends WeightdError {}

/** The keeper (weightd-keeper, docs/keeper.md) refused a request, or could not be started. */
export class KeeperError extends WeightdError {}

/** Errors crossing a worker-thread boundary arrive as plain data; this restores the class. */
export interface SerializedError {
  name: string;
  code: string;
  message: string;
  details?: Record<string, unknown>;
  stack?: string;
}

const classes: Record<string, new (code: ErrorCode, message: string, details?: Record<string, unknown>) => WeightdError> = {
  UsageError, CheckpointError, ShardingError, DeviceError, RankFailedError, RendezvousError, ProtocolError, ServeError, KeeperError,
};

/** The string `code` a Node or addon error carries, if any. */
export function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

export function serializeError(err: unknown): SerializedError {
  if (err instanceof WeightdError) {
    return { name: err.name, code: err.code, message: err.message, details: err.details, stack: err.stack };
  }
  if (err instanceof Error) {
    const code = errorCode(err) ?? 'E_INTERNAL';
    return { name: err.name, code, message: err.message, stack: err.stack };
  }
  return { name: 'Error', code: 'E_INTERNAL', message: String(err) };
}

export function deserializeError(data: SerializedError): WeightdError {
  const Cls = classes[data.name] ?? WeightdError;
  const err = new Cls(receivedCode(data.code), data.message, data.details ?? {});
  if (data.stack) err.stack = data.stack;
  return err;
}
