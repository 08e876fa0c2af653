// Which connections watch which model names (the watch command): each is told on its connection
// when a newer version of a name it watches is ready, when a version of it is about to be
// dropped, and (if it asked) when one is stale. Bounded per connection, so a client cannot make
// the server hold names without limit, and in connections (a watcher is never idle-closed), so
// watchers cannot hold every connection of the socket.
import { ServeError } from '../errors.js';

/** Names one connection may watch. */
export const MAX_WATCHES_PER_CONNECTION = 16;

export class WatchTable {
  /** The most connections that may watch (ServeLimits.maxWatchers), read at each new watcher. */
  readonly #maxWatchers: () => number;
  readonly #byConnection = new Map<number, Set<string>>();
  /** The names each connection also hears model_stale of. */
  readonly #stale = new Map<number, Set<string>>();

  constructor(maxWatchers: () => number) {
    this.#maxWatchers = maxWatchers;
  }

  /**
   * Adds `name` to the connection's watches (`stale`: with model_stale); throws
   * E_TOO_MANY_WATCHES past the bound of names, E_TOO_MANY_WATCHERS when the connection would be
   * one watcher too many. Returns whether it is new.
   */
  add(connectionId: number, name: string, stale = false): boolean {
    const max = this.#maxWatchers();
    if (!this.#byConnection.has(connectionId) && this.#byConnection.size >= max) {
      throw new ServeError('E_TOO_MANY_WATCHERS', `${this.#byConnection.size} connections of this socket watch already, the most it keeps (WEIGHTD_SERVE_MAX_WATCHERS=${max}); watch on a connection that watches already (up to ${MAX_WATCHES_PER_CONNECTION} names each), or try again once a watcher closes`, { limit: max });
    }
    const names = this.#byConnection.get(connectionId) ?? new Set<string>();
    const added = !names.has(name);
    if (added && names.size >= MAX_WATCHES_PER_CONNECTION) {
      throw new ServeError('E_TOO_MANY_WATCHES', `this connection already watches ${names.size} models (${[...names].join(', ')}), the most one may; unwatch one or open another connection`, { watched: [...names] });
    }
    // Only a name within the bound: a refused one must neither grow the table nor hear events.
    if (stale) this.#stale.set(connectionId, (this.#stale.get(connectionId) ?? new Set<string>()).add(name));
    names.add(name);
    this.#byConnection.set(connectionId, names);
    return added;
  }

  /** Whether the connection watches anything (it is then kept open while idle). */
  watches(connectionId: number): boolean {
    return this.#byConnection.has(connectionId);
  }

  namesOf(connectionId: number): string[] {
    return [...(this.#byConnection.get(connectionId) ?? [])];
  }

  /** The connections to tell of `event` about `name`: every watcher, and for model_stale those that asked for it. */
  watchersOf(name: string, event?: string): number[] {
    const table = event === 'model_stale' ? this.#stale : this.#byConnection;
    return [...table].filter(([, names]) => names.has(name)).map(([id]) => id);
  }

  connectionClosed(connectionId: number): void {
    this.#byConnection.delete(connectionId);
    this.#stale.delete(connectionId);
  }
}
