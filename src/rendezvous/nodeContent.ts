// What nodes compare at the ready barrier so that a node whose copy of the checkpoint differs by
// one byte anywhere fails the group by name (docs/multi-node.md, "Content"). Every node's fill
// digests every tensor of the checkpoint whole, bytes its own ranks do not copy included
// (docs/spec/fingerprint.md §8), so any two nodes' digests are comparable however tp is split.
// A node reports its version 3 checkpoint fingerprint and each tensor's digest cut to its first
// 8 hex digits: 50,000 tensors fit in 400 kB of one rendezvous frame, and a digest that differs
// in its prefix names its tensor (a difference hidden by an equal prefix, 2^-32 likely, still
// differs in the fingerprint and fails the group, naming no tensor).
import { fullContentFingerprint } from '../checkpoint/fingerprint.js';
import type { CheckpointPlan } from '../checkpoint/types.js';

export const DIGEST_PREFIX_HEX = 8;
/** More tensors than this: only the fingerprint is sent (the frame bound, groupMessages.ts). */
export const MAX_COMPARED_TENSORS = 100_000;

export interface NodeContent {
  /** The version 3 checkpoint fingerprint (the same on every rank of a node). */
  fingerprint: string;
  /** Each tensor's digest prefix, concatenated in the plan's contentTensors order; '' past MAX_COMPARED_TENSORS. */
  digests: string;
}

/** What this node reports, from its plan and a local rank's digests; undefined without digests. */
export function nodeContent(plan: CheckpointPlan, digests: readonly string[] | undefined): NodeContent | undefined {
  if (!digests || digests.length === 0 || digests.length !== plan.ranks[0]?.contentTensors.names.length) return undefined;
  return {
    fingerprint: fullContentFingerprint(plan.fingerprintFields, digests).fingerprint,
    digests: digests.length > MAX_COMPARED_TENSORS ? '' : digests.map((d) => d.slice(0, DIGEST_PREFIX_HEX)).join(''),
  };
}

/** The tensors whose digests differ between two nodes (names from `names`), [] when only the fingerprints tell; undefined when equal. */
export function contentDifference(names: readonly string[], ours: NodeContent, theirs: NodeContent): string[] | undefined {
  if (ours.fingerprint === theirs.fingerprint) return undefined;
  const differ: string[] = [];
  const w = DIGEST_PREFIX_HEX;
  if (ours.digests.length === theirs.digests.length && ours.digests.length === names.length * w) {
    for (let i = 0; i < names.length; i++) {
      if (ours.digests.slice(i * w, (i + 1) * w) !== theirs.digests.slice(i * w, (i + 1) * w)) differ.push(names[i]!);
    }
  }
  return differ;
}
