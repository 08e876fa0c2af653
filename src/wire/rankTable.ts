/** One row of the global rank table: where each tensor-parallel rank lives. */
export interface RankTableEntry {
  globalRank: number;
  nodeRank: number;
  localRank: number;
  hostName: string;
  deviceUuid: string;
}

/**
 * Global rank = node_rank * local_world_size + local_rank: exactly the position of that GPU in
 * the engine's own contiguous rank order, which is what makes a cached shard the right one.
 */
export function globalRank(nodeRank: number, localWorldSize: number, localRank: number): number {
  return nodeRank * localWorldSize + localRank;
}

export function nodeRankTable(nodeRank: number, hostName: string, deviceUuids: string[]): RankTableEntry[] {
  return deviceUuids.map((deviceUuid, localRank) => ({
    globalRank: globalRank(nodeRank, deviceUuids.length, localRank),
    nodeRank,
    localRank,
    hostName,
    deviceUuid,
  }));
}

/** The global table of a whole group, in global-rank order, from every node's devices. */
export function groupRankTable(nodes: Array<{ nodeRank: number; hostName: string; deviceUuids: string[] }>): RankTableEntry[] {
  return [...nodes].sort((a, b) => a.nodeRank - b.nodeRank).flatMap((n) => nodeRankTable(n.nodeRank, n.hostName, n.deviceUuids));
}
