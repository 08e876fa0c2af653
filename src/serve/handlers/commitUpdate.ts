// commit_update: seals (host) or copies into memory no writer maps (cuda), and digests, what the
// writer wrote on this rank; the last local rank of the model to commit gets the new version's
// number and fingerprints once it serves (updateDesk.ts).
import { rankFingerprint } from '../../checkpoint/fingerprint.js';
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { CommitUpdateReply, RequestOf } from '../../wire/protocol.js';

export async function commitUpdate(req: RequestOf<'commit_update'>, services: DeviceServices, caller: Caller): Promise<string> {
  if (!services.updates) throw new ServeError('E_NO_UPDATE', 'this socket takes no updates, so none is in progress on it');
  const done = await services.updates.desk.commit(req.update, caller);
  const reply: CommitUpdateReply = {
    id: req.id,
    ok: true,
    model: done.name,
    waiting: done.waiting,
    ...(done.fingerprint
      ? { version: done.version, modelFingerprint: done.fingerprint.fingerprint, fingerprint: rankFingerprint(done.fingerprint.fingerprint, done.service.rank.globalRank) }
      : {}),
  };
  return JSON.stringify(reply);
}
