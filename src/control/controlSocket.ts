// The control socket's file names and frame bounds, which both ends use: the daemon and
// `weightd ctl`. Apart from the request schemas (controlProtocol.ts), so that ctl loads no zod.

/** A control request is a path and a few numbers: far below the serving protocol's bound. */
export const MAX_CONTROL_REQUEST_BYTES = 64 << 10;
export const MAX_CONTROL_REPLY_BYTES = 16 << 20;

// A daemon's control socket and its lock, control-<pid>.sock and .lock: the socket directory's
// names are defined with it (a client's socket search skips them: docs/spec/socket-names.md).
export { CONTROL_FILE } from '../wire/socketDir.js';
export const controlSocketName = (pid = process.pid) => `control-${pid}`;
