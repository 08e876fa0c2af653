// `weightd fingerprint`: the fingerprints a client should expect, computed from the checkpoint
// on disk exactly as the daemon computes them (docs/spec/fingerprint.md). A Python engine can
// compute the same without Node (weightd_client.expected_fingerprint); other engines run this
// once and pass the result to get_state.
import { planCheckpoint } from '../checkpoint/planCheckpoint.js';
import { sampleWithAddon } from '../native/sampleDigest.js';
import { resolveNodeOptions } from '../nodeOptions.js';
import { expectedOfRank } from '../client/expectedFingerprint.js';

export interface FingerprintRequest {
  model: string;
  tensorParallelSize?: number;
  planFile?: string;
}

export async function printFingerprints(req: FingerprintRequest): Promise<string> {
  // The daemon's own validation, so a bad value is reported the same way (exit 2).
  const config = await resolveNodeOptions({ model: req.model, tensorParallelSize: req.tensorParallelSize, planFile: req.planFile });
  const { modelDir, tpSize, planFile } = config.models[0];
  const plan = await planCheckpoint(modelDir, { tpSize, planFile, sampler: sampleWithAddon });
  return `${JSON.stringify(
    {
      model: plan.modelDir,
      architecture: plan.architecture,
      tpSize: plan.tpSize,
      fingerprint: plan.fingerprint,
      ranks: plan.ranks.map((_, rank) => ({ globalRank: rank, ...expectedOfRank(plan, rank) })),
    },
    null,
    2,
  )}\n`;
}
