// commit_publish: seals and digests what the engine wrote; from then on the processed layout
// serves beside its version (publishDesk.ts), and get_processed maps it.
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { CommitPublishReply, RequestOf } from '../../wire/protocol.js';

export async function commitPublish(req: RequestOf<'commit_publish'>, services: DeviceServices, caller: Caller): Promise<string> {
  if (!services.updates) throw new ServeError('E_NO_PUBLISH', 'this socket takes no publishes, so none is in progress on it');
  const { service, layout } = await services.updates.publishes.commit(req.publish, caller);
  const reply: CommitPublishReply = { id: req.id, ok: true, model: service.name, base: service.rank.fingerprint, key: layout.key, bytes: layout.bytes };
  return JSON.stringify(reply);
}
