// At a node's start, before unplanned shards are dropped (dropUnplanned.ts): the models an earlier
// daemon loaded at run time (weightd ctl load, node.load) are not on this command line, but their
// kept records carry the load request (KeptRecord.load). Each whose checkpoint is still there and
// still the same is planned again, to be adopted like a model of the command line; any other is
// left out, with a log line naming the model, its directory and why, and dropUnplanned drops it.
import { statSync } from 'node:fs';
import { planModel, spansGroup, type KeptAtStart, type PlannedModel } from '../models/planModel.js';
import type { Logger } from '../log.js';
import { resolveModelSpec } from '../models/modelSpecs.js';
import type { NodeConfig } from '../nodeOptions.js';
import { parseKeptRecord, type KeptLoad } from '../keeper/keptRecord.js';

export interface RestoreInput {
  /** What the keeper holds (its LIST), read once at the start for this, the models' plans and dropUnplanned.ts. */
  kept: KeptAtStart;
  config: NodeConfig;
  /** The devices this node's own model runs on: a record of another device is another daemon's. */
  devices: readonly string[];
  /** The models this start plans from its command line, which win over a stored request of their name or fingerprint. */
  started: ReadonlyArray<{ name: string; fingerprint: string }>;
  log: Logger;
}

/** A stored load request and when its record was kept. */
interface Candidate {
  load: KeptLoad;
  keptAt: string;
}

/** Plans every model to restore. Never throws: a model that cannot be planned is left out, saying why. */
export async function restoreLoaded({ kept, config, devices, started, log }: RestoreInput): Promise<PlannedModel[]> {
  const mine = new Set(devices);
  // The newest request per name: an older version of it (a swap the last daemon did not finish
  // draining) is dropped as unplanned.
  const newest = new Map<string, Candidate>();
  for (const r of kept.records) {
    if (!mine.has(r.device) || r.ownerAlive) continue;
    const parsed = parseKeptRecord(r.record);
    if (!('record' in parsed) || parsed.record.load === undefined) continue;
    const { load, keptAt } = parsed.record;
    const seen = newest.get(load.name);
    if (!seen || seen.keptAt < keptAt) newest.set(load.name, { load, keptAt });
  }
  const restored: PlannedModel[] = [];
  for (const { load } of newest.values()) {
    const planned = await planCandidate(load, { kept, config, started, log });
    if (planned) restored.push(planned);
  }
  return restored;
}

async function planCandidate(load: KeptLoad, { kept, config, started, log }: Pick<RestoreInput, 'kept' | 'config' | 'started' | 'log'>): Promise<PlannedModel | undefined> {
  const fields = { name: load.name, model: load.modelDir, fingerprint: load.fingerprint };
  const leaveOut = (why: string, extra: Record<string, unknown> = {}): undefined =>
    void log.warn({ ...fields, ...extra }, `not restoring model "${load.name}" (loaded at run time from ${load.modelDir}): ${why}; its kept shards are dropped. Load it again with weightd ctl load if it is still wanted`);
  const same = started.find((m) => m.name === load.name || m.fingerprint === load.fingerprint);
  if (same) {
    log.info({ ...fields, commandLine: same.name }, `model "${load.name}", loaded at run time from ${load.modelDir}, is not restored from the keeper: this command line serves ${same.name === load.name ? 'a model of that name' : `that checkpoint as "${same.name}"`}, which wins`);
    return undefined;
  }
  try {
    if (!statSync(load.modelDir).isDirectory()) return leaveOut(`${load.modelDir} is no longer a directory`);
  } catch (err) {
    return leaveOut(`its directory ${load.modelDir} is gone (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
  if (spansGroup(load.tpSize, config)) {
    return leaveOut(
      `at tp ${load.tpSize} it spans the group of ${config.nnodes} nodes, and a model across nodes is not restored: each node's keeper holds only its own shards, and a node that restarts alone could not know that the others still serve this version`,
    );
  }
  let planned: PlannedModel;
  try {
    const spec = resolveModelSpec({ model: load.modelDir, name: load.name, tensorParallelSize: load.tpSize, planFile: load.planFile, layouts: load.layouts });
    planned = await planModel(spec, config, log, undefined, kept);
  } catch (err) {
    return leaveOut(`it cannot be planned again (${(err as Error).message})`);
  }
  if (planned.plan.fingerprint !== load.fingerprint) {
    return leaveOut(`its checkpoint changed since it was loaded (fingerprint ${load.fingerprint} then, ${planned.plan.fingerprint} now)`, { now: planned.plan.fingerprint });
  }
  log.info(fields, `restoring model "${load.name}", loaded at run time from ${load.modelDir}: its ranks adopt what the keeper holds`);
  return { ...planned, origin: 'restore' };
}
