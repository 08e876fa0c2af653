// release: frees a model version's rank memory (the one named by fingerprint, else the socket's first), refused while other clients hold leases unless forced (their
// leases are then revoked and their mappings point at freed memory). A release that comes while
// another is under way answers when that one ends.
import { ServeError } from '../../errors.js';
import { leaseInfo, type Caller } from '../leaseTable.js';
import type { ReleaseReply, RequestOf } from '../../wire/protocol.js';
import type { DeviceServices } from '../deviceServices.js';
import { versionFor } from './modelVersions.js';

export async function release(req: RequestOf<'release'>, services: DeviceServices, caller: Caller): Promise<string> {
  const service = versionFor(services, req.fingerprint);
  const already: ReleaseReply = { id: req.id, ok: true, alreadyReleased: true, revoked: [] };
  if (service.status === 'released') return JSON.stringify(already);
  if (service.status === 'releasing') {
    await service.releaseDone;
    return JSON.stringify(already);
  }
  const force = req.force ?? false;
  const others = service.leases.othersThan(caller);
  if (others.length > 0 && !force) {
    const pids = [...new Set(others.map((l) => l.owner.pid))];
    throw new ServeError(
      'E_LEASE_HELD',
      `release refused: ${others.length} lease(s) of other clients (pid ${pids.join(', ')}) still use rank ${service.rank.globalRank}'s memory; ` +
        'they must detach (or exit) first, or pass force to revoke them (their mappings then point at freed memory)',
      { leases: others.map(leaseInfo) },
    );
  }
  const revoked = service.leases.clear(caller);
  for (const l of revoked) service.logLease(l, 'lease revoked by a forced release');
  service.log.info({ peerPid: caller.pid, force, revoked: revoked.length }, 'release requested: freeing the rank');
  await service.release();
  const reply: ReleaseReply = { id: req.id, ok: true, alreadyReleased: false, revoked: revoked.map(leaseInfo) };
  return JSON.stringify(reply);
}
