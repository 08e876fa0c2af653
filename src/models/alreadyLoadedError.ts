// One checkpoint, one copy. Two models with the same fingerprint (the same checkpoint bytes at
// the same tp size, layouts and plan) would hold the same memory twice, and since unload and
// list go by fingerprint too, `ctl unload <fingerprint>` would take both while `ctl list`
// showed one. So a daemon serves each fingerprint once: a load of one it serves is refused
// (ModelControl.load), and so is a start that lists one twice (prepareNode). One rule, one
// message, for both.
import { UsageError } from '../errors.js';

/** A model as the rule names it. */
export interface CheckpointEntry {
  name: string;
  modelDir: string;
  tpSize: number;
}

/** `entry` refused because its checkpoint is served, or listed, as `holder` already; `fix` says what to do. */
export function alreadyLoadedError(entry: CheckpointEntry, fingerprint: string, holder: { name: string; modelDir?: string }, fix: string): UsageError {
  const held = holder.modelDir === undefined ? `"${holder.name}"` : `"${holder.name}" (${holder.modelDir})`;
  return new UsageError('E_USAGE', `${entry.modelDir} at tp ${entry.tpSize} ("${entry.name}") is already loaded as ${held} (fingerprint ${fingerprint}); ${fix}`, {
    name: entry.name,
    holder: holder.name,
    fingerprint,
  });
}

/** Throws alreadyLoadedError for the first of `entries` whose fingerprint an earlier one has (the models a node starts with). */
export function refuseSameCheckpoint(entries: Array<CheckpointEntry & { fingerprint: string }>): void {
  const first = new Map<string, CheckpointEntry>();
  for (const e of entries) {
    const holder = first.get(e.fingerprint);
    if (holder) throw alreadyLoadedError(e, e.fingerprint, holder, `serve each checkpoint once: drop one of the two from --model or the --models file`);
    first.set(e.fingerprint, e);
  }
}
