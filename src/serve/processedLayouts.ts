// The processed layouts one rank of a model version serves (docs/engines.md, "Publishing what the
// engine computed"): parameters an engine derived from this version's bytes (requantized,
// transposed, repacked for its kernel) and handed back, each under the key of what produced it
// (docs/spec/processed-key.md). They live and go with the version's rank: its release closes
// them. Their memory is sealed memfds the publish desk (publishDesk.ts) made, filled and sealed.
import { addon } from '../native/addon.js';
import type { ProcessedRef, SegmentRef, TensorMeta } from '../wire/protocol.js';

/** One published layout, sealed: what get_processed serves. */
export interface ProcessedLayout {
  key: string;
  keyFields: Record<string, string>;
  tensors: TensorMeta[];
  /** The sealed segments (read-only descriptors this object owns), in segment order, with their handle kind (PublishBackend.handle). */
  segments: { segment: number; bytes: number; fd: number; handle: string }[];
  /** Each tensor's digest, in `tensors`' order (the fill's digest code, as a written version's). */
  digests: string[];
  bytes: number;
  /** When its commit made it served (ms since the epoch). */
  publishedAt: number;
  /** When get_processed last granted a lease on it (ms since the epoch); absent while none has. */
  lastMappedAt?: number;
}

/**
 * At most this many processed layouts, published or being published, beside one rank of a
 * version (E_TOO_MANY_PUBLISHED past it). Each holds a descriptor for the daemon's life of its
 * version and a page (host) or an allocation granule (cuda) however small it is, so the byte cap
 * (--processed-max-percent) alone lets a client of the daemon's user that publishes many tiny
 * keys take descriptors the sockets need. Honest engines publish one layout per engine version,
 * kernel and architecture that run on the node: a few.
 */
export const PROCESSED_MAX_LAYOUTS = 16;

export class ProcessedLayouts {
  readonly #layouts = new Map<string, ProcessedLayout>();
  #closed = false;

  get(key: string): ProcessedLayout | undefined {
    return this.#layouts.get(key);
  }

  /** Every layout's key, fields and size: what a client whose key differs is told. */
  list(): ProcessedRef[] {
    return [...this.#layouts.values()].map((l) => ({ key: l.key, keyFields: l.keyFields, bytes: l.bytes }));
  }

  get size(): number {
    return this.#layouts.size;
  }

  /** Every layout kept, oldest first. */
  layouts(): ProcessedLayout[] {
    return [...this.#layouts.values()];
  }

  /** Bytes of every layout published: what the cap (--processed-max-percent) counts. */
  get bytes(): number {
    return [...this.#layouts.values()].reduce((sum, l) => sum + l.bytes, 0);
  }

  /** Keeps `layout`, whose descriptors are this object's from now on; false (nothing kept) once closed: the caller closes them. */
  add(layout: ProcessedLayout): boolean {
    if (this.#closed) return false;
    this.#layouts.set(layout.key, layout);
    return true;
  }

  /** Takes `key`'s layout out (get_processed no longer finds it) and returns it: its descriptors are the caller's to close. */
  remove(key: string): ProcessedLayout | undefined {
    const layout = this.#layouts.get(key);
    this.#layouts.delete(key);
    return layout;
  }

  /** The version's rank is freed: every layout goes with it (an engine's mapping keeps its own pages). Idempotent. */
  close(): void {
    this.#closed = true;
    for (const l of this.#layouts.values()) closeLayout(l);
    this.#layouts.clear();
  }

  get closed(): boolean {
    return this.#closed;
  }
}

/** Closes the descriptors a layout owns (an engine's mapping keeps its own pages). */
export function closeLayout(layout: ProcessedLayout): void {
  for (const s of layout.segments) addon().closeFd(s.fd);
}

/** The segments of a layout as get_processed lists them. */
export function segmentRefs(layout: ProcessedLayout): SegmentRef[] {
  return layout.segments.map((s) => ({ segment: s.segment, bytes: s.bytes, handle: s.handle }));
}
