// How a model actor (src/models/modelMachine.ts) records what each of its ranks reported.
import type { RankStatus } from '../nodeStatus.js';
import type { RankEvent } from './rankContract.js';

export function updateRank(ranks: RankStatus[], localRank: number, patch: Partial<RankStatus>): RankStatus[] {
  return ranks.map((r) => (r.localRank === localRank ? { ...r, ...patch } : r));
}

/** The row without its waiting flag, which only a progress report that waits sets. */
function notWaiting(ranks: RankStatus[], localRank: number): RankStatus[] {
  return ranks.map((r) => {
    if (r.localRank !== localRank || r.waitingForGroup === undefined) return r;
    const { waitingForGroup: _, ...rest } = r;
    return rest;
  });
}

type Report = Extract<RankEvent, { type: 'RANK_DEVICE' | 'RANK_PROGRESS' | 'RANK_LOADED' | 'RANK_KEPT' | 'RANK_DESCRIPTORS_CHECKED' }>;

/** What a rank's device, progress, loaded and kept reports change in its row. */
export function recordReport(ranks: RankStatus[], e: Report): RankStatus[] {
  switch (e.type) {
    case 'RANK_DEVICE':
      return updateRank(ranks, e.localRank, { device: e.info, state: 'loading' });
    case 'RANK_PROGRESS':
      return updateRank(notWaiting(ranks, e.localRank), e.localRank, { bytes: e.bytes, totalBytes: e.totalBytes, seconds: e.seconds, ...(e.waitingForGroup ? { waitingForGroup: true as const } : {}) });
    case 'RANK_LOADED':
      return updateRank(notWaiting(ranks, e.localRank), e.localRank, { state: 'loaded', device: e.device, bytes: e.bytes, seconds: e.seconds, segments: e.segments, source: e.source, digests: e.digests, ...(e.descriptors ? { descriptors: e.descriptors } : {}) });
    case 'RANK_DESCRIPTORS_CHECKED':
      return updateRank(ranks, e.localRank, { descriptors: e.error ? 'refused' : 'checked', ...(e.info ? { device: e.info } : {}) });
    case 'RANK_KEPT':
      return updateRank(ranks, e.localRank, { kept: e.kept, keptReason: e.reason });
  }
}
