// The process's file descriptors, shared out among its listeners (docs/operations.md, "File
// descriptors"). Every connection a listener accepts holds one descriptor, and RLIMIT_NOFILE is one
// limit for the whole process: a listener that may hold as many as it is offered lets one flood
// (21,000 loopback connections to the inspect port, say) take the descriptors an engine's attach,
// the control socket and the daemon's own files need. So every listener admits each connection
// against this one budget:
//   - a quarter of the limit (at least 64) is never lent to connections: the daemon's own files,
//     segments, worker threads and its link to the keeper;
//   - each listener has a cap and a guarantee, descriptors set aside for it alone;
//   - what is left, the shared reserve, goes to trusted listeners only (Unix sockets whose peers
//     are checked to be the daemon's user: the device sockets and the control socket), beyond
//     their guarantee and up to their cap. An untrusted listener (TCP: the inspect server, the
//     rendezvous coordinator) holds its guarantee and no more, and the untrusted together are
//     guaranteed at most a quarter of what connections may hold, whatever order they start in.
// No listener can then take what another is guaranteed, and no stranger what the reserve holds.
import { readFileSync } from 'node:fs';
import type { Duplex } from 'node:stream';
import { UsageError } from '../errors.js';

export interface ListenerBudget {
  /** Named in refusals and logs: "control socket", "inspect server", a device's socket. */
  name: string;
  /** The most connections it holds at once. */
  cap: number;
  /** Descriptors set aside for it alone; an untrusted listener is given its cap. */
  guaranteed: number;
  /** Its peers are the daemon's user (SO_PEERCRED): it may also draw on the shared reserve. */
  trusted: boolean;
  /** A guarantee below `count` fails the start (E_FD_LIMIT) instead of refusing every peer later. */
  atLeast?: { count: number; of: string };
}

/** Why a connection was not admitted, with the limit it met. */
export interface BudgetRefusal {
  limit: number;
  message: string;
}

/** The soft RLIMIT_NOFILE of this process (Node raises it to the hard limit at start). */
export function openFileLimit(limits = '/proc/self/limits'): number {
  const line = /^Max open files\s+(\d+|unlimited)\s/m.exec(readFileSync(limits, 'utf8'));
  // "unlimited" cannot be set for RLIMIT_NOFILE on Linux; a budget of 2^20 stands for it.
  return line?.[1] === undefined || line[1] === 'unlimited' ? 1 << 20 : Number(line[1]);
}

export class DescriptorBudget {
  readonly limit: number;
  /** Descriptors lent to connections at most; the rest are the process's own. */
  readonly pool: number;
  readonly #shares = new Set<ListenerShare>();

  constructor(limit: number) {
    this.limit = limit;
    this.pool = limit - Math.max(64, Math.floor(limit / 4));
  }

  /**
   * A listener's share. Its guarantee is what the pool still has beside the others' guarantees,
   * when that is less than asked (a low RLIMIT_NOFILE): `share.guaranteed` says what it got.
   */
  share(asked: ListenerBudget): ListenerShare {
    let free = Math.max(0, this.pool - this.#guaranteedTotal());
    if (!asked.trusted) free = Math.min(free, Math.max(0, Math.floor(this.pool / 4) - this.#guaranteedTotal((s) => !s.trusted)));
    const guaranteed = Math.min(asked.trusted ? asked.guaranteed : asked.cap, asked.cap, free);
    if (asked.atLeast && guaranteed < asked.atLeast.count) {
      throw new UsageError(
        'E_FD_LIMIT',
        `the ${asked.name} is granted ${guaranteed} connections of RLIMIT_NOFILE ${this.limit}, fewer than its ${asked.atLeast.count} ${asked.atLeast.of} (docs/operations.md, "File descriptors"): raise \`ulimit -n\` (LimitNOFILE= under systemd; 65536, say) and start again`,
        { listener: asked.name, limit: this.limit, granted: guaranteed, needed: asked.atLeast.count },
      );
    }
    const share = new ListenerShare(this, { ...asked, guaranteed, cap: asked.trusted ? asked.cap : guaranteed });
    this.#shares.add(share);
    return share;
  }

  /** Descriptors of the shared reserve still free: the pool less every guarantee and every loan beyond one. */
  reserveFree(): number {
    let used = this.#guaranteedTotal();
    for (const s of this.#shares) used += Math.max(0, s.open - s.guaranteed);
    return this.pool - used;
  }

  /** @internal ListenerShare.close */
  remove(share: ListenerShare): void {
    this.#shares.delete(share);
  }

  #guaranteedTotal(which: (s: ListenerShare) => boolean = () => true): number {
    let n = 0;
    for (const s of this.#shares) if (which(s)) n += s.guaranteed;
    return n;
  }
}

/** One listener's part of the budget: the connections it holds now, and whether it may take one more. */
export class ListenerShare {
  readonly name: string;
  readonly cap: number;
  readonly guaranteed: number;
  readonly trusted: boolean;
  readonly #budget: DescriptorBudget;
  readonly #held = new Set<Duplex>();

  constructor(budget: DescriptorBudget, b: ListenerBudget) {
    this.#budget = budget;
    this.name = b.name;
    this.cap = b.cap;
    this.guaranteed = b.guaranteed;
    this.trusted = b.trusted;
  }

  /** Connections held now. A destroyed one no longer counts, even before its 'close' event: its descriptor is closed already. */
  get open(): number {
    for (const s of this.#held) if (s.destroyed) this.#held.delete(s);
    return this.#held.size;
  }

  /**
   * Takes a descriptor for `stream` and gives it back when the stream is destroyed; or says why
   * not, and the caller closes it.
   */
  take(stream: Duplex): BudgetRefusal | undefined {
    const open = this.open;
    if (open >= this.cap) return { limit: this.cap, message: `${this.name}: ${this.cap} connections are open, its most` };
    if (open >= this.guaranteed && this.#budget.reserveFree() <= 0) {
      return { limit: this.#budget.pool, message: `${this.name}: the descriptors lent to connections (${this.#budget.pool} of RLIMIT_NOFILE ${this.#budget.limit}) are all in use` };
    }
    this.#held.add(stream);
    stream.once('close', () => this.#held.delete(stream));
    return undefined;
  }

  /** Gives the share back to the budget (the listener closed); connections it holds are the listener's to close. */
  close(): void {
    this.#budget.remove(this);
  }
}

let processBudget: DescriptorBudget | undefined;

/** The one budget of this process, from its RLIMIT_NOFILE when first asked for. */
export function descriptorBudget(): DescriptorBudget {
  return (processBudget ??= new DescriptorBudget(openFileLimit()));
}
