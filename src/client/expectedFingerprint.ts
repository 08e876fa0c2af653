// The fingerprint a client should expect for one rank of a checkpoint on disk, computed the way
// the daemon computes it, so that only a cache of exactly these weights, sharded this way, for
// this rank, is used.
import { planCheckpoint } from '../checkpoint/planCheckpoint.js';
import { rankFingerprintFields } from '../serve/rankFingerprintFields.js';
import type { Expected } from './weightdClient.js';

export async function expectedFingerprint(modelDir: string, tpSize: number, globalRank: number, planFile?: string): Promise<Expected> {
  const plan = await planCheckpoint(modelDir, { tpSize, planFile });
  const rank = plan.ranks[globalRank];
  if (!rank) throw new RangeError(`rank ${globalRank} does not exist with tensor-parallel size ${tpSize}`);
  return { fingerprint: rank.fingerprint, fingerprintFields: rankFingerprintFields(plan.fingerprintFields, globalRank) };
}
