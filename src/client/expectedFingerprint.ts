// The fingerprint a client should expect for one rank of a checkpoint on disk, computed the way
// the daemon computes it, so that only a cache of exactly these weights, sharded this way, for
// this rank, is used. docs/spec/fingerprint.md defines it; the Python client's
// expected_fingerprint computes the same without Node.
import { planCheckpoint } from '../checkpoint/planCheckpoint.js';
import type { CheckpointPlan } from '../checkpoint/types.js';
import { rankFingerprintFields } from '../serve/rankFingerprintFields.js';
import type { Expected } from './weightdClient.js';

/** The layouts a fingerprint can be computed for (the Python client's LAYOUTS). */
export const FINGERPRINT_LAYOUTS = ['checkpoint'] as const;
export type FingerprintLayout = (typeof FINGERPRINT_LAYOUTS)[number];

export async function expectedFingerprint(modelDir: string, tpSize: number, globalRank: number, planFile?: string, layout: FingerprintLayout = 'checkpoint'): Promise<Expected> {
  if (!FINGERPRINT_LAYOUTS.includes(layout)) {
    throw new RangeError(`layout ${JSON.stringify(layout)} is not one a fingerprint can be computed for; the layouts are: ${FINGERPRINT_LAYOUTS.join(', ')}`);
  }
  const plan = await planCheckpoint(modelDir, { tpSize, planFile });
  if (!plan.ranks[globalRank]) throw new RangeError(`rank ${globalRank} does not exist with tensor-parallel size ${tpSize}`);
  return expectedOfRank(plan, globalRank);
}

/** What rank `globalRank` of a planned checkpoint will report: its fingerprint and fields. */
export function expectedOfRank(plan: CheckpointPlan, globalRank: number): Required<Expected> {
  return { fingerprint: plan.ranks[globalRank]!.fingerprint, fingerprintFields: rankFingerprintFields(plan.fingerprintFields, globalRank) };
}
