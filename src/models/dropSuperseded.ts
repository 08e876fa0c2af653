// A load that replaces the versions of its name (a hot swap, ModelControl.load) has the keeper
// drop their records before it serves: with them kept, a restart would serve what the swap's
// reply said was replaced (a written version of the old checkpoint, as current, when the name is
// on the command line). Unlike dropModelShards, a drop that fails fails the whole: the swap is
// then refused, and the caller keeps the older versions again.
import { KeeperClient } from '../keeper/keeperClient.js';
import { shardsOf } from './shardsOf.js';
import type { PlannedModel } from './planModel.js';

/** Drops the records of every local rank of `models` in turn; rejects with the first drop that failed, naming its shard. */
export async function dropSuperseded(socket: string, models: readonly PlannedModel[]): Promise<void> {
  const keeper = new KeeperClient(socket);
  for (const planned of models) {
    for (const { device, fingerprint } of shardsOf(planned)) {
      try {
        await keeper.drop(device, fingerprint);
      } catch (err) {
        const version = planned.version ?? 0;
        throw new Error(`the keeper did not drop version ${version}'s shard on device ${device} (${(err as Error).message})`, { cause: err });
      }
    }
  }
}
