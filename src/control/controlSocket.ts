// The control socket's file names and frame bounds, which both ends use: the daemon and
// `weightd ctl`. Apart from the request schemas (controlProtocol.ts), so that ctl loads no zod.

/** A control request is a path and a few numbers: far below the serving protocol's bound. */
export const MAX_CONTROL_REQUEST_BYTES = 64 << 10;
export const MAX_CONTROL_REPLY_BYTES = 16 << 20;

/** A daemon's control socket and its lock in the socket directory: control-<pid>.sock, control-<pid>.lock. */
export const CONTROL_FILE = /^control-(\d+)\.(sock|lock)$/;
export const controlSocketName = (pid = process.pid) => `control-${pid}`;
