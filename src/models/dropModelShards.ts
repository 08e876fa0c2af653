// A model that failed is not to be served again by this daemon, so what the keeper holds of it is
// of no use: its ranks may have adopted their shards (a model restored from the keeper, whose
// ranks took them over) or kept them once it served. The keeper would hold that memory, for this
// daemon that owns it, until the daemon ends; dropped here, it is free for the next load.
import { fromPromise } from 'xstate';
import { KeeperClient } from '../keeper/keeperClient.js';
import { shardsOf } from './shardsOf.js';
import type { Logger } from '../log.js';
import type { PlannedModel } from './planModel.js';

export interface DropModelShardsInput {
  socket: string;
  planned: PlannedModel;
  log: Logger;
}

/** Drops the keeper's records of each of the model's local ranks. Never throws: a shard not dropped is logged. */
export async function dropModelShards({ socket, planned, log }: DropModelShardsInput): Promise<void> {
  const keeper = new KeeperClient(socket);
  for (const { device, fingerprint } of shardsOf(planned)) {
    try {
      if ((await keeper.drop(device, fingerprint)) > 0) log.info({ keeper: socket, device, fingerprint }, `dropped the kept shard of model "${planned.spec.name}", which failed`);
    } catch (err) {
      log.warn({ keeper: socket, device, fingerprint, reason: (err as Error).message }, `could not drop the kept shard of model "${planned.spec.name}", which failed: the keeper holds it until this daemon ends`);
    }
  }
}

export const dropModelShardsActor = fromPromise<void, DropModelShardsInput>(({ input }) => dropModelShards(input));
