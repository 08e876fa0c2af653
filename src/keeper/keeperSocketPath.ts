// The one rule for where a node's keeper listens: --keeper-socket, else keeper.sock in the
// node's socket directory (private to the user, like the rank sockets beside it).
import { join } from 'node:path';
import { KEEPER_SOCKET_NAME } from '../wire/socketDir.js';

// The name is the socket directory's (a client's socket search skips it: docs/spec/socket-names.md).
export { KEEPER_SOCKET_NAME };
/** A keeper the daemon spawns writes its log lines here, beside its socket. */
export const KEEPER_LOG_NAME = 'keeper.log';

export function keeperSocketPath(config: { keeper: { socket?: string } }, socketDir: string): string {
  return config.keeper.socket ?? join(socketDir, KEEPER_SOCKET_NAME);
}
