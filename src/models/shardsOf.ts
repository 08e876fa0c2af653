// The keeper files each rank's shard by its device and its rank fingerprint: what a model's local
// ranks have there, for the drops that name a model's shards (dropUnplanned.ts at a start,
// dropModelShards.ts when a model fails).
import type { ModelPlacement, PlannedModel } from './planModel.js';
import type { ShardKey } from '../keeper/shardKey.js';
import { globalRank } from '../wire/rankTable.js';

/** The shard of each of the model's local ranks, on its device. */
export function shardsOf({ devices, plan, placement }: Pick<PlannedModel, 'devices' | 'plan'> & { placement: Pick<ModelPlacement, 'nodeRank' | 'localWorldSize'> }): ShardKey[] {
  return devices.map((d, localRank) => ({ device: d.uuid, fingerprint: plan.ranks[globalRank(placement.nodeRank, placement.localWorldSize, localRank)]!.fingerprint }));
}
