// A served layout's tensors by name, made once per tensor list: a writer's versions share their
// base's list, and a map of every name was made anew by each begin_update, pull_tensors and pull
// plan check (~13 ms at 50,439 tensors on the development VM: bench/RESULTS.md, issue 31).
import type { TensorEntry } from '../checkpoint/types.js';

const indexes = new WeakMap<readonly TensorEntry[], ReadonlyMap<string, TensorEntry>>();

/** `tensors` by name; the list must not change once asked for (a served layout's never does). */
export function tensorsByName(tensors: readonly TensorEntry[]): ReadonlyMap<string, TensorEntry> {
  let index = indexes.get(tensors);
  if (!index) indexes.set(tensors, (index = new Map(tensors.map((t) => [t.name, t]))));
  return index;
}
