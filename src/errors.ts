// Every error weightd raises carries a stable `code` (for programs and tests) and a message
// that names the value at fault and what to do about it (for people).

export class WeightdError extends Error {
  readonly code: string;
  readonly details: Record<string, unknown>;
  constructor(code: string, message: string, details: Record<string, unknown> = {}, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.details = details;
  }
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

/** Errors crossing a worker-thread boundary arrive as plain data; this restores the class. */
export interface SerializedError {
  name: string;
  code: string;
  message: string;
  details?: Record<string, unknown>;
  stack?: string;
}

const classes: Record<string, new (code: string, message: string, details?: Record<string, unknown>) => WeightdError> = {
  UsageError, CheckpointError, ShardingError, DeviceError, RankFailedError, RendezvousError, ProtocolError, ServeError,
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
  const err = new Cls(data.code, data.message, data.details ?? {});
  if (data.stack) err.stack = data.stack;
  return err;
}
