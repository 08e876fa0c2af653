// One resident rank built by hand on the host backend, as the supervisor builds it (plan,
// allocate, fill, export, toServedRankData), for in-process tests of the serving layer without a
// whole node.
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import type { LayoutName } from '../../src/checkpoint/types.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { toServedRankData, type ServedRankData } from '../../src/serve/servedRankData.js';

export interface LoadedRank {
  served: ServedRankData;
  device: DeviceHandle;
}

export async function loadServedRank(modelDir: string, device: { uuid: string }, layouts: LayoutName[] = []): Promise<LoadedRank> {
  const plan = await planCheckpoint(modelDir, { tpSize: 1, layouts });
  const rank = plan.ranks[0]!;
  const handle = new DeviceHandle('host', 0, device);
  try {
    await handle.allocate(rank.segments);
    await handle.fill(rank.files, rank.ops, rank.totalBytes, {});
    const served = toServedRankData({
    name: 'tiny-llama',
    plan, globalRank: 0, localRank: 0, nodeRank: 0, nnodes: 1, backend: 'host', device: handle.info(), segments: handle.exportSegments() });
    return { served, device: handle };
  } catch (err) {
    await handle.free();
    throw err;
  }
}
