// The control socket's messages (docs/operations.md, Control socket): one request per
// connection, in the serving protocol's frames (frameCodec.ts), each reply one frame. Bounded:
// a request is at most MAX_CONTROL_REQUEST_BYTES (controlSocket.ts), and unknown keys are refused.
import { isAbsolute } from 'node:path';
import { z } from 'zod';
import { KnownLayoutName, layoutNames } from '../checkpoint/layouts/layoutRegistry.js';
import { EVICTION_POLICIES } from '../models/evictionPolicy.js';
import { ModelName } from '../wire/protocol.js';

/**
 * A path in a load request: absolute, since a relative one would name a file relative to the
 * daemon's working directory, which the caller neither sees nor chose (weightd ctl resolves a
 * relative one against its own).
 */
const AbsolutePath = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => isAbsolute(p), { message: 'must be an absolute path (weightd ctl load makes a relative one absolute against its own directory)' });

export const LoadControl = z.strictObject({
  cmd: z.literal('load'),
  /** The checkpoint directory. */
  model: AbsolutePath,
  name: ModelName.optional(),
  tensorParallelSize: z.number().int().min(1).max(4096).optional(),
  planFile: AbsolutePath.optional(),
  layouts: z.array(KnownLayoutName).refine((names) => names.length <= layoutNames().length, { error: () => `at most ${layoutNames().length} layouts, each once` }).optional(),
  /** This load's eviction policy instead of the daemon's --evict. */
  evict: z.enum(EVICTION_POLICIES).optional(),
});
export const UnloadControl = z.strictObject({ cmd: z.literal('unload'), target: z.string().min(1).max(256), force: z.boolean().optional() });
export const ListControl = z.strictObject({ cmd: z.literal('list') });
/** Makes a retained version of a model current again (docs/weight-updates.md). */
export const RollbackControl = z.strictObject({ cmd: z.literal('rollback'), name: ModelName, version: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER) });
export const ControlRequest = z.discriminatedUnion('cmd', [LoadControl, UnloadControl, ListControl, RollbackControl]);
export type ControlRequest = z.infer<typeof ControlRequest>;
export type ControlCommand = ControlRequest['cmd'];
export type ControlRequestOf<C extends ControlCommand> = Extract<ControlRequest, { cmd: C }>;
/**
 * The commands, read from the schema: each has one handler (src/control/handlers/) and one
 * `weightd ctl` entry (src/cli/ctl/); test/control/controlCommands.test.ts holds them to this.
 */
export const CONTROL_COMMANDS: readonly ControlCommand[] = ControlRequest.options.map((o) => o.shape.cmd.value);

export type ControlReply = { ok: true; [key: string]: unknown } | { ok: false; error: { code: string; message: string; details?: Record<string, unknown> } };

export interface ControlLimits {
  /** Requests in a burst, then `perSecond`. */
  burst: number;
  perSecond: number;
  /** A request must arrive complete within this of connecting. */
  readTimeoutMs: number;
  maxConnections: number;
}

export const DEFAULT_CONTROL_LIMITS: ControlLimits = { burst: 20, perSecond: 5, readTimeoutMs: 5_000, maxConnections: 16 };
