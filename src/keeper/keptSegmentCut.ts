// How a restart that plans from the headers cuts a host arena when the keeper holds its shards.
// Builds before issue 33's default kept every host arena whole (one segment), and a kept shard
// is adopted only into an arena cut the same way (keptRecord.ts, `arena` and `segments`): a
// restart after an upgrade would otherwise read every such model again instead of adopting it.
import type { SegmentCut } from '../checkpoint/arenaSegmentBytes.js';
import type { KeptRecord as ListedRecord } from './keeperProtocol.js';
import { parseKeptRecord } from './keptRecord.js';

/**
 * The cut for model `name` on `devices` (its local ranks'): 'whole' when a record the keeper holds
 * for one of them keeps an arena whole, either a shard of this checkpoint (its fingerprint is a
 * rank's of the plan) or a version written over this model (its written versions are served only
 * in their checkpoint's layout, src/actors/restoreWritten.ts); else `cut`.
 */
export function keptSegmentCut(cut: SegmentCut, name: string, devices: readonly string[], records: readonly ListedRecord[]): (rankFingerprints: readonly string[]) => SegmentCut {
  return (rankFingerprints) => {
    if (cut === 'whole') return cut;
    const whole = records.some((listed) => {
      if (listed.ownerAlive || !devices.includes(listed.device)) return false;
      const parsed = parseKeptRecord(listed.record);
      if ('refusal' in parsed || parsed.record.segments.length !== 1) return false;
      return rankFingerprints.includes(listed.fingerprint) || parsed.record.written?.name === name;
    });
    return whole ? 'whole' : cut;
  };
}
