// Every tensor's full digest (docs/spec/fingerprint.md §8) read from the checkpoint on disk by
// the addon's reader threads: what a fill of the same files reports, for whoever wants to prove
// what a daemon holds (weightd verify, expectedFingerprint with full).
import { cpus } from 'node:os';
import { addon } from './addon.js';
import { packTensorRanges } from './fillRecords.js';
import type { CheckpointPlan } from '../checkpoint/types.js';

/** The plan's contentTensors' digests, in order, hashed on `threads` threads (default: every CPU, at most 16). */
export function diskDigests(plan: CheckpointPlan, threads = Math.min(16, cpus().length)): Promise<string[]> {
  const rank = plan.ranks[0]!;
  return addon().digestFiles(rank.files, packTensorRanges(rank.contentTensors.ranges), Math.max(1, threads));
}
