// `weightd keeper status|stop`: the keeper at a socket, found by the socket alone (PING for its
// pid, LIST for what it holds), since a keeper a daemon spawned outlives it with no unit or
// terminal to find it by. Exit codes: 0 done, 1 the keeper did not stop (or is not one this
// user may stop), 2 no keeper answers.
import { connect } from 'node:net';
import { errorCode, KeeperError, UsageError } from '../errors.js';
import { formatBytes } from '../inspect/loadProgress.js';
import { KeeperClient } from '../keeper/keeperClient.js';
import { parseKeptRecord } from '../keeper/keptRecord.js';
import { addon, type PeerCredentials } from '../native/addon.js';
import { isProcessAlive, processIdentity } from '../wire/processLiveness.js';

/** One kept shard as `keeper status` shows it. */
export interface HeldShard {
  device: string;
  fingerprint: string;
  /** From the daemon's record; null when the record is not one this weightd reads. */
  model: string | null;
  tpRank: number | null;
  bytes: number | null;
  /** Its model version's number: a written version's (docs/weight-updates.md), 0 for a checkpoint's; null as model. */
  version: number | null;
  /** When that version last became current (ms since the epoch), if its record says (KeptRecord.currentSince). */
  currentSince: number | null;
  ownerPid: number;
  ownerAlive: boolean;
  /** When the keeper frees it unless a daemon adopts it; null while its owner lives. */
  freedAt: string | null;
}

export interface KeeperHolding {
  socket: string;
  pid: number;
  uptimeMs: number;
  fds: number;
  bytes: number;
  shards: HeldShard[];
}

/** How long `keeper stop` waits for the keeper to free everything and exit. */
const STOP_WAIT_MS = 30_000;

/** What the keeper at `socket` holds; E_NO_KEEPER (a usage error) when none answers. */
export async function keeperHolding(socket: string, now = Date.now()): Promise<KeeperHolding> {
  const client = new KeeperClient(socket);
  let ping;
  let records;
  try {
    ping = await client.ping();
    records = await client.list();
  } catch (err) {
    throw new UsageError('E_NO_KEEPER', `no keeper answers at ${socket} (${(err as Error).message}); pass --socket or --weight-cache-socket-dir for another one`, { socket });
  }
  const shards = records.map((r): HeldShard => {
    const parsed = parseKeptRecord(r.record);
    const record = 'record' in parsed ? parsed.record : undefined;
    return {
      device: r.device,
      fingerprint: r.fingerprint,
      model: record?.model ?? null,
      tpRank: record?.tpRank ?? null,
      bytes: record?.totalBytes ?? null,
      version: record ? (record.written?.version ?? 0) : null,
      currentSince: record?.currentSince ?? null,
      ownerPid: r.ownerPid,
      ownerAlive: r.ownerAlive,
      freedAt: r.ownerAlive ? null : new Date(now + r.expiresInMs).toISOString(),
    };
  });
  return { socket, pid: ping.pid, uptimeMs: ping.uptimeMs, fds: ping.fds, bytes: shards.reduce((n, s) => n + (s.bytes ?? 0), 0), shards };
}

export function formatHolding(h: KeeperHolding): string {
  const head = `keeper pid ${h.pid} at ${h.socket}: up ${Math.round(h.uptimeMs / 1000)} s, holds ${h.shards.length} shard${h.shards.length === 1 ? '' : 's'} (${formatBytes(h.bytes)}, ${h.fds} descriptors)`;
  const lines = h.shards.map((s) => {
    const what = s.model === null ? 'a record this weightd does not read' : `${s.model}${s.version ? ` v${s.version}` : ''} rank ${s.tpRank}, ${formatBytes(s.bytes ?? 0)}`;
    const owner = s.ownerAlive ? `owner pid ${s.ownerPid} (running)` : `owner gone: freed at ${s.freedAt} unless a daemon adopts it`;
    return `  ${s.device}  ${s.fingerprint.slice(0, 16)}  ${what}  ${owner}`;
  });
  return `${[head, ...lines].join('\n')}\n`;
}

export async function askKeeper(c: { action: 'status' | 'stop'; socket: string; json: boolean }, out: NodeJS.WritableStream = process.stdout): Promise<number> {
  const holding = await keeperHolding(c.socket);
  if (c.action === 'status') {
    out.write(c.json ? `${JSON.stringify(holding, null, 2)}\n` : formatHolding(holding));
    return 0;
  }
  // Any process can serve the socket and report any pid: signal only the pid the kernel names
  // as the socket's peer (SO_PEERCRED), when it is this user's and the one reported.
  const peer = await peerOf(c.socket);
  const uid = process.getuid!();
  if (peer.uid !== uid || peer.pid !== holding.pid) {
    throw new KeeperError('E_PEER', `the process serving ${c.socket} is pid ${peer.pid} of uid ${peer.uid} but reports pid ${holding.pid}; not a keeper of this user (uid ${uid}), so nothing is signalled: stop it by its own means, or pass --socket for another keeper`, { socket: c.socket, peerPid: peer.pid, peerUid: peer.uid, reportedPid: holding.pid });
  }
  const keeper = processIdentity(holding.pid);
  try {
    process.kill(holding.pid, 'SIGTERM');
  } catch (err) {
    // ESRCH: the keeper exited since it answered, which is what stop asks for.
    if (errorCode(err) !== 'ESRCH') throw err;
  }
  const deadline = Date.now() + STOP_WAIT_MS;
  while (isProcessAlive(keeper) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  const stopped = !isProcessAlive(keeper);
  const result = { socket: c.socket, pid: holding.pid, stopped, freedShards: holding.shards.length, freedBytes: holding.bytes };
  if (c.json) out.write(`${JSON.stringify(result, null, 2)}\n`);
  else if (stopped) out.write(`stopped keeper pid ${holding.pid} at ${c.socket}: freed ${holding.shards.length} shard${holding.shards.length === 1 ? '' : 's'} (${formatBytes(holding.bytes)})\n`);
  if (!stopped) process.stderr.write(`weightd keeper stop: E_KEEPER_STOP: keeper pid ${holding.pid} still runs ${STOP_WAIT_MS / 1000} s after SIGTERM; kill -9 ${holding.pid} ends it\n`);
  return stopped ? 0 : 1;
}

/** The credentials the kernel holds for the process serving `socketPath`. */
function peerOf(socketPath: string): Promise<PeerCredentials> {
  return new Promise((resolve, reject) => {
    const socket = connect(socketPath);
    socket.once('error', reject);
    socket.once('connect', () => {
      try {
        const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
        if (fd === undefined || fd < 0) throw new KeeperError('E_PEER', `cannot check who serves ${socketPath}: the socket has no descriptor`);
        resolve(addon().peerCredentials(fd));
      } catch (err) {
        reject(err);
      } finally {
        socket.destroy();
      }
    });
  });
}
