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
}

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

  /** The version's rank is freed: every layout goes with it (an engine's mapping keeps its own pages). Idempotent. */
  close(): void {
    this.#closed = true;
    for (const l of this.#layouts.values()) for (const s of l.segments) addon().closeFd(s.fd);
    this.#layouts.clear();
  }

  get closed(): boolean {
    return this.#closed;
  }
}

/** The segments of a layout as get_processed lists them. */
export function segmentRefs(layout: ProcessedLayout): SegmentRef[] {
  return layout.segments.map((s) => ({ segment: s.segment, bytes: s.bytes, handle: s.handle }));
}
