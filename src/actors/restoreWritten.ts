// At a node's start, before unplanned shards are dropped (dropUnplanned.ts): the versions a writer
// committed (docs/weight-updates.md) that an earlier daemon kept. No checkpoint file holds their
// bytes, so their records carry what serving them needs (KeptRecord.written): the version's number,
// its §9 fields and every tensor's digest, its base. Each version of a model this start plans
// (its checkpoint's version 0, from the command line or restored) is planned again as that
// model's layout with the version's fingerprint, recomputed from the records (a record that does
// not add up is refused, alone, naming it); the model control serves them once the node is ready
// (ModelControl.restoreWritten), in order, with the version that was current made current again.
import { writtenVersionFingerprint, rankFingerprint } from '../checkpoint/fingerprint.js';
import { fillPlanOf } from '../checkpoint/types.js';
import type { Logger } from '../log.js';
import type { PlannedModel, RestoredVersions } from '../models/planModel.js';
import type { KeptRecord as ListedRecord } from '../keeper/keeperProtocol.js';
import { arenaDigest, parseKeptRecord, type KeptRecord, type KeptWritten } from '../keeper/keptRecord.js';
import { writtenDirectory } from '../keeper/writtenDirectory.js';
import { writtenIdentityRefusal } from '../keeper/writtenIdentity.js';
import { globalRank } from '../wire/rankTable.js';

export interface RestoreWrittenInput {
  /** What the keeper holds (its LIST at this start). */
  records: readonly ListedRecord[];
  /** The models this start plans (command line and restored): a written version's layout is its name's checkpoint version's. */
  planned: readonly PlannedModel[];
  /** This node's devices: a record of another device is another daemon's. */
  devices: readonly string[];
  log: Logger;
}

type Written = { record: KeptRecord & { written: KeptWritten }; listed: ListedRecord };

/** Plans every written version to restore. Never throws: a version that does not check out is left out (dropUnplanned drops it), saying why. */
export function restoreWritten({ records, planned, devices, log }: RestoreWrittenInput): RestoredVersions {
  const mine = records.filter((r) => devices.includes(r.device) && !r.ownerAlive);
  const plannedRanks = new Set(planned.flatMap((m) => m.plan.ranks.map((r) => r?.fingerprint)));
  const versions = new Map<string, Written[]>();
  for (const listed of mine) {
    const parsed = parseKeptRecord(listed.record);
    if ('refusal' in parsed) {
      // A record a planned rank would adopt is judged (and logged) by that rank.
      if (!plannedRanks.has(listed.fingerprint)) {
        log.warn({ device: listed.device, fingerprint: listed.fingerprint, field: parsed.refusal.field }, `refused the kept record of device ${listed.device} under ${listed.fingerprint}: ${parsed.refusal.message}; it is dropped, never served`);
      }
      continue;
    }
    const { record } = parsed;
    if (record.written === undefined) continue;
    const key = `${record.written.name}\u0000${record.written.version}`;
    versions.set(key, [...(versions.get(key) ?? []), { record: record as Written['record'], listed }]);
  }
  const models: PlannedModel[] = [];
  for (const ranks of versions.values()) {
    const { name, version } = ranks[0]!.record.written;
    const checked = planVersion(ranks, planned);
    if (typeof checked === 'string') {
      log.warn({ name, version, devices: ranks.map((r) => r.listed.device) }, `refused kept written version ${version} of model "${name}": ${checked}; its kept shards are dropped, never served`);
      continue;
    }
    if (checked.base !== undefined && !planned.some((m) => m.plan.fingerprint === checked.base) && !ranksOfFingerprint(versions, checked.base)) {
      log.info(
        { name, version, base: checked.base },
        `written version ${version} of model "${name}" was written over a version that no longer serves (its checkpoint files changed since, or it was not kept): its bytes were written, not read from those files, so it is restored as it was`,
      );
    }
    models.push(checked);
  }
  models.sort((a, b) => a.spec.name.localeCompare(b.spec.name) || a.version! - b.version!);
  return { models, current: currentVersions(models, mine, planned) };
}

/** Whether a written version's records hold `fingerprint` (it is a written version's, not a checkpoint's). */
function ranksOfFingerprint(versions: Map<string, Written[]>, fingerprint: string): boolean {
  return [...versions.values()].some((ranks) => ranks.some((r) => r.record.fingerprint === rankFingerprint(fingerprint, r.record.tpRank)));
}

/** The version planned on its name's checkpoint version, or why its records are refused. */
function planVersion(ranks: Written[], planned: readonly PlannedModel[]): PlannedModel | string {
  const { name, version, fields, base } = ranks[0]!.record.written;
  const checkpoint = planned.find((m) => m.spec.name === name && m.origin !== 'update');
  if (!checkpoint) return `no model named "${name}" is on this command line or restored, and a written version is served only beside its model's checkpoint version`;
  const { plan, placement, devices } = checkpoint;
  if (placement.nnodes > 1) return `model "${name}" spans ${placement.nnodes} nodes, and written versions serve on one`;
  // Its digests are of the tensors of the checkpoint it was written over: served only as those.
  for (const r of ranks) {
    const changed = writtenIdentityRefusal(r.record, { name, modelDir: checkpoint.spec.modelDir, plan, resolve: writtenDirectory });
    if (changed !== undefined) return changed;
  }
  // Every local rank's record, each once: the version's fingerprint covers every rank's digests.
  const byRank = new Map<number, Written>();
  for (const r of ranks) {
    const w = r.record.written;
    if (w.base !== base || JSON.stringify(w.fields) !== JSON.stringify(fields)) return `its ranks' records disagree on its base or fields (device ${r.listed.device})`;
    if (byRank.has(r.record.tpRank)) return `two records hold its rank ${r.record.tpRank}`;
    byRank.set(r.record.tpRank, r);
  }
  const local = devices.map((d, localRank) => ({ device: d.uuid, g: globalRank(placement.nodeRank, placement.localWorldSize, localRank) }));
  if (byRank.size !== plan.tpSize || local.some(({ g }) => !byRank.has(g))) {
    return `the keeper holds ranks ${[...byRank.keys()].sort().join(', ')} of it, and model "${name}" has ${plan.tpSize} (every rank is needed to serve it)`;
  }
  const rankDigests = [...byRank.keys()].sort((a, b) => a - b).map((g) => byRank.get(g)!.record.written.digests);
  const { fingerprint } = writtenVersionFingerprint(fields, rankDigests);
  for (const { device, g } of local) {
    const r = byRank.get(g)!;
    const rank = plan.ranks[g]!;
    if (r.listed.device !== device) return `its rank ${g} was kept on device ${r.listed.device}, and this start places that rank on ${device}`;
    if (r.record.fingerprint !== rankFingerprint(fingerprint, g)) {
      return `its rank ${g}'s record says fingerprint ${r.record.fingerprint}, and its fields and digests make ${rankFingerprint(fingerprint, g)}: the record is corrupt or not this weightd's`;
    }
    if (r.record.written.digests.length !== rank.tensors.length) return `its rank ${g}'s record has ${r.record.written.digests.length} tensor digests, and the model's rank serves ${rank.tensors.length} tensors`;
    if (r.record.arena !== arenaDigest(fillPlanOf(rank)) || JSON.stringify(r.record.segments) !== JSON.stringify(rank.segments)) {
      return `its rank ${g}'s segments are laid out otherwise than model "${name}"'s now (its checkpoint's layout changed), so its tensors cannot be placed`;
    }
    if (r.record.written.shared.some((s) => s >= rank.segments.length)) return `its rank ${g}'s record shares segments past its ${rank.segments.length}`;
  }
  return {
    ...checkpoint,
    // No files: its content was written, not read, so no change to the checkpoint makes it stale.
    plan: { ...plan, fingerprint, fingerprintFields: fields, files: [], ranks: plan.ranks.map((r, g) => r && { ...r, fingerprint: rankFingerprint(fingerprint, g) }) },
    origin: 'update',
    version,
    base,
    // The check above found the record's directory to be this one: kept again, its records say so.
    writtenOver: writtenDirectory(checkpoint.spec.modelDir),
    ...(ranks[0]!.record.currentSince !== undefined ? { currentSince: ranks[0]!.record.currentSince } : {}),
    written: local.map(({ g }) => ({ digests: byRank.get(g)!.record.written.digests, shared: byRank.get(g)!.record.written.shared })),
  };
}

/**
 * Per name with a written version, the version current when the last daemon ended: the one whose
 * records say it became current last (KeptRecord.currentSince: a commit's version says so from its
 * first record; a rollback, and this restart, keep the version they make current again with a
 * fresh one: ModelControl; a version that never became current since it was loaded says nothing).
 * A checkpoint version's records count under the fingerprint a written version names as its base,
 * or the one planned now.
 */
function currentVersions(models: readonly PlannedModel[], records: readonly ListedRecord[], planned: readonly PlannedModel[]): RestoredVersions['current'] {
  const current: RestoredVersions['current'] = [];
  for (const name of new Set(models.map((m) => m.spec.name))) {
    const written = models.filter((m) => m.spec.name === name);
    const checkpoint = planned.find((m) => m.spec.name === name && m.origin !== 'update')!;
    const fingerprints = new Map<string, number>(written.map((m) => [m.plan.fingerprint, m.version!]));
    for (const fp of [checkpoint.plan.fingerprint, ...written.map((m) => m.base!)]) if (!fingerprints.has(fp)) fingerprints.set(fp, 0);
    let latest: { version: number; since: number } | undefined;
    for (const r of records) {
      const parsed = parseKeptRecord(r.record);
      if (!('record' in parsed) || parsed.record.currentSince === undefined) continue;
      const since = parsed.record.currentSince;
      const version = [...fingerprints].find(([fp]) => parsed.record.fingerprint === rankFingerprint(fp, parsed.record.tpRank))?.[1];
      if (version !== undefined && (!latest || latest.since < since || (latest.since === since && latest.version < version))) latest = { version, since };
    }
    if (latest) current.push({ name, version: latest.version });
  }
  return current;
}
