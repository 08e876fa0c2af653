// watch: this connection is told, from now on, when a newer version of the model is ready on
// this device, when a version of it is about to be dropped, and (asked with `stale`) when one is
// stale (protocol.ts ModelEvent). The
// connection is then kept open while idle, like one that holds a copy lease.
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { RequestOf, WatchReply } from '../../wire/protocol.js';
import { modelRef } from './modelVersions.js';

export function watch(req: RequestOf<'watch'>, services: DeviceServices, caller: Caller): string {
  services.watches.add(caller.connectionId, req.model, req.stale === true);
  const reply: WatchReply = {
    id: req.id,
    ok: true,
    watching: services.watches.namesOf(caller.connectionId),
    versions: services.all.filter((s) => s.name === req.model).map((s) => modelRef(s, services)),
  };
  return JSON.stringify(reply);
}
