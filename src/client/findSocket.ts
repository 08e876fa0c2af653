// Finding the socket of a rank or a device: the node manifest first (written by a ready daemon),
// then a look at every socket in the directory, for a daemon whose manifest was overwritten by
// another daemon sharing the directory.
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { ServeError } from '../errors.js';
import { readNodeManifest } from '../wire/nodeManifest.js';
import { isProcessAlive } from '../wire/processLiveness.js';
import { CONTROL_FILE, defaultSocketDir, KEEPER_SOCKET_NAME, SOCKET_SUFFIX, socketPathFor } from '../wire/socketDir.js';
import { WeightdClient } from './weightdClient.js';

export interface FindSocketOptions {
  /** Default: the daemon's default directory for this user. */
  socketDir?: string;
  /** The global tensor-parallel rank wanted. */
  globalRank?: number;
  /** Or the device (GPU UUID, host id) wanted. */
  deviceUuid?: string;
}

function notFound(dir: string, what: string): ServeError {
  return new ServeError(
    'E_NO_SOCKET',
    `no weightd socket in ${dir} serves ${what}; the daemon is not running or not ready yet (load from disk meanwhile), or it uses another --weight-cache-socket-dir`,
    { socketDir: dir },
  );
}

/** Whether a file name in the socket dir may be a rank's socket (docs/spec/socket-names.md): not the keeper's, not a control socket. */
export function isRankSocketName(name: string): boolean {
  return name.endsWith(SOCKET_SUFFIX) && name !== KEEPER_SOCKET_NAME && !CONTROL_FILE.test(name);
}

/** The socket path serving the rank or device asked for. */
export async function findSocket(options: FindSocketOptions): Promise<string> {
  const dir = options.socketDir ?? defaultSocketDir();
  if (options.deviceUuid !== undefined) {
    const path = socketPathFor(dir, options.deviceUuid);
    if (!existsSync(path)) throw notFound(dir, `device ${options.deviceUuid}`);
    return path;
  }
  const rank = options.globalRank;
  if (rank === undefined) throw new ServeError('E_USAGE', 'findSocket needs a globalRank or a deviceUuid');
  const manifest = readNodeManifest(dir);
  const entry = manifest?.ranks.find((r) => r.globalRank === rank);
  if (manifest && entry && isProcessAlive({ pid: manifest.pid, startTime: manifest.startTime }) && existsSync(entry.socketPath)) return entry.socketPath;
  let names: string[] = [];
  try {
    names = readdirSync(dir).filter(isRankSocketName);
  } catch {
    // No directory: nothing serves.
  }
  for (const name of names) {
    const path = join(dir, name);
    try {
      const client = await WeightdClient.connect(path, { timeoutMs: 2_000 });
      try {
        if ((await client.ping()).rank.globalRank === rank) return path;
      } finally {
        client.close();
      }
    } catch {
      // A stale socket or a daemon that is stopping: try the next one.
    }
  }
  throw notFound(dir, `rank ${rank}`);
}
