// The fingerprint a client should expect for one rank of a checkpoint on disk, computed the way
// the daemon computes it, so that only a cache of exactly these weights, sharded this way, for
// this rank, is used. docs/spec/fingerprint.md defines it; the Python client's
// expected_fingerprint computes the same without Node.
import { diskDigests } from '../native/diskDigests.js';
import { fullContentFingerprint, rankFingerprint } from '../checkpoint/fingerprint.js';
import { planCheckpoint } from '../checkpoint/planCheckpoint.js';
import type { CheckpointPlan } from '../checkpoint/types.js';
import { rankFingerprintFields } from '../checkpoint/rankFingerprintFields.js';
import type { Expected } from './weightdClient.js';

/**
 * The one layout a fingerprint is computed for: an engine layout is a view of the same shard, so
 * it has the checkpoint's fingerprint (the Python client refuses the same way).
 */
export type FingerprintLayout = 'checkpoint';

/**
 * `full`: the full-content version (docs/spec/fingerprint.md §8), which reads every byte of the
 * checkpoint; only a daemon that holds exactly these bytes matches it, and one older than it
 * answers with a mismatch naming `content` and `protocol` (then load from disk).
 */
export async function expectedFingerprint(modelDir: string, tpSize: number, globalRank: number, planFile?: string, layout: FingerprintLayout = 'checkpoint', full = false): Promise<Expected> {
  if (layout !== 'checkpoint') {
    throw new RangeError(`layout ${JSON.stringify(layout)} is not one a fingerprint can be computed for; the layouts are: checkpoint`);
  }
  const plan = await planCheckpoint(modelDir, { tpSize, planFile });
  if (!plan.ranks[globalRank]) throw new RangeError(`rank ${globalRank} does not exist with tensor-parallel size ${tpSize}`);
  if (!full) return expectedOfRank(plan, globalRank);
  const { fingerprint, fields } = fullContentFingerprint(plan.fingerprintFields, await diskDigests(plan));
  return { fingerprint: rankFingerprint(fingerprint, globalRank), fingerprintFields: rankFingerprintFields(fields, globalRank) };
}

/** What rank `globalRank` of a planned checkpoint will report: its fingerprint and fields. */
export function expectedOfRank(plan: CheckpointPlan, globalRank: number): Required<Expected> {
  return { fingerprint: plan.ranks[globalRank]!.fingerprint, fingerprintFields: rankFingerprintFields(plan.fingerprintFields, globalRank) };
}
