// How the machines that own ranks (the supervisor, each model) record what a rank reported.
import type { RankStatus } from '../nodeStatus.js';

export function updateRank(ranks: RankStatus[], localRank: number, patch: Partial<RankStatus>): RankStatus[] {
  return ranks.map((r) => (r.localRank === localRank ? { ...r, ...patch } : r));
}
