// At a node's start, before any rank loads: what the keeper holds for this node's devices that
// none of the models it starts with plans (a model left off the command line, an older checkpoint,
// a model an earlier daemon loaded with ctl load that restoreLoaded.ts did not restore) is dropped. The node holds the devices' locks by
// now, and only the daemon of a device adopts its shards, so nobody would take these: kept, they
// would hold device memory until the keeper's adoption window ends, and stand in the way of the
// loads (and fit checks) of this start. Doing it here, once per node and before any rank exists,
// is what lets each model's ranks keep and adopt their own shards without knowing the others'.
import type { Logger } from '../log.js';
import { KeeperClient } from './keeperClient.js';
import type { KeptRecord as ListedRecord } from './keeperProtocol.js';
import type { ShardKey } from './shardKey.js';

/**
 * Drops, of what the keeper holds (`records`, its LIST at this start), the records of the devices
 * `planned` names that it does not plan. Never throws: a drop that fails is logged.
 */
export async function dropUnplanned(socket: string, records: readonly ListedRecord[], planned: readonly ShardKey[], log: Logger): Promise<void> {
  const keeper = new KeeperClient(socket);
  const mine = new Set(planned.map((k) => k.device));
  const wanted = new Set(planned.map(keyOf));
  // A record whose owner lives is another process's (a daemon still ending): never taken from under it.
  const stale = records.filter((r) => mine.has(r.device) && !wanted.has(keyOf(r)) && !r.ownerAlive);
  for (const r of stale) {
    try {
      await keeper.drop(r.device, r.fingerprint);
      log.info({ keeper: socket, device: r.device, fingerprint: r.fingerprint }, "dropped a kept shard that no model of this start plans (it is not on this daemon's command line)");
    } catch (err) {
      log.warn({ keeper: socket, device: r.device, fingerprint: r.fingerprint, reason: (err as Error).message }, 'could not drop a kept shard that no model of this start plans: it is freed when the adoption window ends');
    }
  }
}

function keyOf(k: ShardKey): string {
  return `${k.device}\u0000${k.fingerprint}`;
}
