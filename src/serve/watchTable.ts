// Which connections watch which model names (the watch command): each is told on its connection
// when a newer version of a name it watches is ready, and when a version of it is about to be
// dropped. Bounded per connection, so a client cannot make the server hold names without limit.
import { ServeError } from '../errors.js';

/** Names one connection may watch. */
export const MAX_WATCHES_PER_CONNECTION = 16;

export class WatchTable {
  readonly #byConnection = new Map<number, Set<string>>();

  /** Adds `name` to the connection's watches; throws E_TOO_MANY_WATCHES past the bound. Returns whether it is new. */
  add(connectionId: number, name: string): boolean {
    const names = this.#byConnection.get(connectionId) ?? new Set<string>();
    if (names.has(name)) return false;
    if (names.size >= MAX_WATCHES_PER_CONNECTION) {
      throw new ServeError('E_TOO_MANY_WATCHES', `this connection already watches ${names.size} models (${[...names].join(', ')}), the most one may; unwatch one or open another connection`, { watched: [...names] });
    }
    names.add(name);
    this.#byConnection.set(connectionId, names);
    return true;
  }

  /** Whether the connection watches anything (it is then kept open while idle). */
  watches(connectionId: number): boolean {
    return this.#byConnection.has(connectionId);
  }

  namesOf(connectionId: number): string[] {
    return [...(this.#byConnection.get(connectionId) ?? [])];
  }

  watchersOf(name: string): number[] {
    return [...this.#byConnection].filter(([, names]) => names.has(name)).map(([id]) => id);
  }

  connectionClosed(connectionId: number): void {
    this.#byConnection.delete(connectionId);
  }
}
