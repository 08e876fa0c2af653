// Who is using a rank's memory right now. Every successful get_state gets its own lease (its own
// export record), so a release can be judged against each live user separately: one client
// freeing the cache can never pull memory out from under another (the reference design's bug,
// where one shared export let a copying client free what a mapping client still used).
//
// Two lifetimes, because the two modes use memory differently:
// - map: the client keeps using the memory after it hangs up (CUDA IPC mappings and mmaps outlive
//   the socket), so the lease follows the client *process*: it ends on detach, when the pid is
//   gone, or on a forced release.
// - copy: the client only needs the memory while it copies, with the connection open; the lease
//   also ends when that connection closes, so a client that crashes mid-copy frees it at once.
// A peer in a pid namespace the daemon cannot see has pid 0 (SO_PEERCRED): its liveness cannot
// be checked, so its leases are bound to the connection whatever the mode.
import { createHash, randomBytes } from 'node:crypto';
import { ServeError } from '../errors.js';
import type { LeaseInfo, ServeMode } from '../wire/protocol.js';
import { isProcessAlive, processIdentity, type ProcessIdentity } from '../wire/processLiveness.js';

export interface Lease {
  id: string;
  owner: ProcessIdentity;
  mode: ServeMode;
  connectionId: number;
  /** Ends when its connection closes: copy mode only (a map lease guards live mappings). */
  connectionBound: boolean;
  sinceMs: number;
  /** The processed layout it was granted for (get_processed): the engine maps that layout's memory as well as the version's. */
  processedKey?: string;
}

/** Who is asking: the peer's pid (SO_PEERCRED) and its connection. */
export interface Caller {
  pid: number;
  connectionId: number;
}

/**
 * Whether `caller` holds `lease`: by pid, or by connection when the pid is unknown (0). A client
 * of unknown pid that reconnected still detaches its lease by id (see detach).
 */
function heldBy(lease: Lease, caller: Caller): boolean {
  return caller.pid > 0 ? lease.owner.pid === caller.pid : lease.connectionId === caller.connectionId;
}

/**
 * Whether `caller` may act on the lease it names by id (detach, get_segment_fds): its holder, on
 * any of its connections (the TypeScript client asks for descriptors on a connection of its own),
 * or anyone who knows the id of a lease of unknown pid: a 96-bit secret given only to its holder.
 */
function namedBy(lease: Lease, caller: Caller, leaseId: string): boolean {
  return lease.id === leaseId && (heldBy(lease, caller) || lease.owner.pid <= 0);
}

/**
 * Live leases one client (a process, or a connection of unknown pid) may hold on one version:
 * an engine holds one a rank it maps (two while it switches); a client that takes leases in a
 * loop and never detaches is refused rather than grow the table, which the liveness sweep, every
 * request's keep-open check and `stats` walk.
 */
export const MAX_LEASES_PER_CLIENT = 256;

export class LeaseTable {
  readonly #leases = new Map<string, Lease>();
  /** When the last lease was granted (ms since the epoch): what an eviction policy orders by. */
  lastGrantedMs: number | undefined;

  /** `processedKey`: a get_processed lease, which also holds that processed layout's memory. */
  grant(caller: Caller, mode: ServeMode, processedKey?: string): Lease {
    let held = 0;
    for (const l of this.#leases.values()) if (heldBy(l, caller)) held++;
    if (held >= MAX_LEASES_PER_CLIENT) {
      const who = caller.pid > 0 ? `process ${caller.pid}` : 'this connection (its pid unseen)';
      throw new ServeError('E_TOO_MANY_LEASES', `${who} holds ${held} leases on this version, its most (${MAX_LEASES_PER_CLIENT}); detach the ones it no longer maps (detach with their leaseId), then ask again`, { limit: MAX_LEASES_PER_CLIENT });
    }
    const lease: Lease = {
      id: randomBytes(12).toString('hex'),
      owner: processIdentity(caller.pid),
      mode,
      connectionId: caller.connectionId,
      // A map lease outlives its connection even when the peer's pid is unknown (0: another pid
      // namespace): the client may close the socket and keep its mappings, so only detach or a
      // forced release may end it; it never expires by itself, which errs towards keeping memory.
      connectionBound: mode === 'copy',
      sinceMs: Date.now(),
      ...(processedKey === undefined ? {} : { processedKey }),
    };
    this.#leases.set(lease.id, lease);
    this.lastGrantedMs = lease.sinceMs;
    return lease;
  }

  get size(): number {
    return this.#leases.size;
  }

  /** Live leases granted for the processed layout `key`: engines that map it now. */
  processedLeases(key: string): number {
    let n = 0;
    for (const l of this.#leases.values()) if (l.processedKey === key) n++;
    return n;
  }

  /** Drops `leaseId` if the caller holds it; without an id, every lease its connection took. */
  detach(caller: Caller, leaseId?: string): Lease[] {
    if (leaseId === undefined) return this.#dropWhere((l) => l.connectionId === caller.connectionId);
    return this.#dropWhere((l) => namedBy(l, caller, leaseId));
  }

  /** The live lease `leaseId` when the caller may use it (namedBy); undefined otherwise. */
  named(caller: Caller, leaseId: string): Lease | undefined {
    const lease = this.#leases.get(leaseId);
    return lease && namedBy(lease, caller, leaseId) ? lease : undefined;
  }

  /** Whether the connection holds a lease that would end if it closed. */
  holdsBound(connectionId: number): boolean {
    for (const l of this.#leases.values()) if (l.connectionBound && l.connectionId === connectionId) return true;
    return false;
  }

  /** A connection closed: its bound leases end; map leases live on with the process. */
  connectionClosed(connectionId: number): Lease[] {
    return this.#dropWhere((l) => l.connectionId === connectionId && l.connectionBound);
  }

  /** Ends the leases of processes that are gone. Returns them, for the log. */
  expireDead(): Lease[] {
    return this.#dropWhere((l) => l.owner.pid > 0 && !isProcessAlive(l.owner));
  }

  /** Live leases the caller does not hold (dead ones are expired first). */
  othersThan(caller: Caller): Lease[] {
    this.expireDead();
    return [...this.#leases.values()].filter((l) => !heldBy(l, caller));
  }

  /** Ends every lease (the memory is being released); returns those the caller did not hold. */
  clear(caller: Caller): Lease[] {
    const others = [...this.#leases.values()].filter((l) => !heldBy(l, caller));
    this.#leases.clear();
    return others;
  }

  list(): LeaseInfo[] {
    return [...this.#leases.values()].map(leaseInfo);
  }

  #dropWhere(pred: (l: Lease) => boolean): Lease[] {
    const dropped = [...this.#leases.values()].filter(pred);
    for (const l of dropped) this.#leases.delete(l.id);
    return dropped;
  }
}

/**
 * What others may see of a lease id: enough to tell leases apart in stats and logs, never
 * enough to detach one (the id is a 96-bit secret; this is 64 bits of its SHA-256).
 */
export function leaseHash(id: string): string {
  return createHash('sha256').update(id).digest('hex').slice(0, 16);
}

export function leaseInfo(l: Lease): LeaseInfo {
  return { leaseHash: leaseHash(l.id), pid: l.owner.pid, mode: l.mode, sinceMs: l.sinceMs, connectionBound: l.connectionBound };
}
