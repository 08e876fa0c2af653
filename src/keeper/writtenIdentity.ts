// What ties a kept written version (docs/weight-updates.md) to the checkpoint version a restart
// serves it beside (docs/spec/kept-written.md). A restart plans a written version as its name's
// checkpoint version's layout: the record's digests are in that layout's manifest order and its
// §9 fields were its base's, so the version is served only where its records say that the
// manifest, those fields and that checkpoint directory are the ones this start plans. The arena
// digest alone is not enough: it covers where bytes go, not which tensor they are (two names
// swapped in a header move nothing), nor which checkpoint the version was written over.
import { sha256Hex } from '../checkpoint/fingerprint.js';
import type { CheckpointPlan, RankPlan } from '../checkpoint/types.js';
import type { KeptRecord, KeptWritten } from './keptRecord.js';

/** The §9 fields a written version makes its own (docs/spec/fingerprint.md §9); every other is its base's, so its checkpoint's. */
const OWN_FIELDS: ReadonlySet<string> = new Set(['content', 'protocol']);

/**
 * Each rank's manifest digest, by its tensors array: a written version's plan shares its base's
 * (only the fingerprints differ), so a commit digests no manifest its base's did not.
 */
const rankDigests = new WeakMap<RankPlan['tensors'], { aliases: RankPlan['aliases']; digest: string }>();

/** A rank's manifest digest (docs/spec/kept-written.md §2). Only arrays of strings and integers: JSON.stringify writes them as RFC 8785 would, fast at 50,000 tensors. */
function rankManifestDigest({ tensors, aliases }: Pick<RankPlan, 'tensors' | 'aliases'>): string {
  const seen = rankDigests.get(tensors);
  if (seen?.aliases === aliases) return seen.digest;
  const sorted = Object.entries(aliases).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const digest = sha256Hex(JSON.stringify([tensors.map((t) => [t.name, t.dtype, t.shape, t.segment, t.offset, t.bytes]), sorted]));
  rankDigests.set(tensors, { aliases, digest });
  return digest;
}

/**
 * The digest of a model's manifest (docs/spec/kept-written.md §2): per tp rank, every tensor's
 * name, dtype, shape, segment, offset and bytes in the manifest's order (the order of a record's
 * digests, so it ties each digest to its tensor), and the aliases.
 */
export function manifestDigest(ranks: CheckpointPlan['ranks']): string {
  return sha256Hex(ranks.map((r) => (r ? rankManifestDigest(r) : '')).join('\n'));
}

/** What a start plans for a written version's name: its checkpoint version's directory, and its plan. */
export interface WrittenIdentityExpectation {
  name: string;
  modelDir: string;
  /** A directory as compared, every symbolic link followed (writtenDirectory.ts: I/O, which this module does none of). */
  resolve: (dir: string) => string;
  plan: Pick<CheckpointPlan, 'fingerprintFields' | 'ranks'>;
}

/**
 * Why a written version's record cannot be served beside this start's checkpoint version, naming
 * what changed; undefined when it can. In order: the directory (another checkpoint), the fields
 * the version took from its base (headers, config, dtypes, tp size, plan file or rules), then the
 * manifest (the tensors its digests are of).
 */
export function writtenIdentityRefusal(record: Pick<KeptRecord, 'model'> & { written: Pick<KeptWritten, 'fields' | 'manifest'> }, e: WrittenIdentityExpectation): string | undefined {
  const [recorded, planned] = [e.resolve(record.model), e.resolve(e.modelDir)];
  if (recorded !== planned) {
    const real = (named: string, resolved: string) => (resolved === named ? named : `${named} (${resolved}, its symbolic links followed)`);
    return `it was written over the checkpoint in ${real(record.model, recorded)}, and this start serves model "${e.name}" from ${real(e.modelDir, planned)}: a written version is restored only beside the checkpoint directory it was written over`;
  }
  const kept = record.written.fields;
  const wanted = e.plan.fingerprintFields;
  const names = [...new Set([...Object.keys(kept), ...Object.keys(wanted)])].filter((f) => !OWN_FIELDS.has(f)).sort();
  const changed = names.filter((f) => kept[f] !== wanted[f]);
  if (changed.length > 0) {
    return `model "${e.name}"'s checkpoint differs from the one it was written over in its fingerprint's ${changed.join(', ')} (docs/spec/fingerprint.md §4), so its tensors are not the version's`;
  }
  if (record.written.manifest !== manifestDigest(e.plan.ranks)) {
    return `its tensors (names, dtypes, shapes, places) are not the ones model "${e.name}" has now, so its digests and bytes would be served as other tensors`;
  }
  return undefined;
}
