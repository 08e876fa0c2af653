// One layout's manifest as the bytes every get_state reply for it carries, encoded once per form:
// at 50k tensors, serializing and encoding 7 MB of JSON per request kept a first attach waiting
// 50-125 ms for the reply's first byte. The packed form (the one both reference clients ask for)
// is encoded when the rank starts serving; the columns and the objects, for clients that ask for
// those, on the first request that wants each. The packed tensors are encoded once per layout's
// tensor list, not per version: a writer's version serves its base's layout (the same list), so a
// commit that publishes one encodes nothing (one encoding, as a commit makes it, took 23-53 ms of
// the development VM's CPU at 50,439 tensors, a large MoE's count, and 0.3-0.9 ms at 183; issue
// 31, bench/results/2026-12-07-host-publication-packed-once).
import type { RankLayout } from '../checkpoint/types.js';
import type { DeviceRef, RankRef, SegmentRef, TensorMeta } from '../wire/protocol.js';
import { toPacked } from '../wire/packedManifest.js';
import { toColumns } from '../wire/tensorColumns.js';

/** What every form of a layout's manifest says besides its tensors. */
export interface ManifestHead {
  fingerprint: string;
  backend: 'host' | 'cuda';
  device: DeviceRef;
  rank: RankRef;
  layout: string;
  segments: SegmentRef[];
}

/**
 * Once the rank's content is digested: its version 3 fingerprint and each checkpoint tensor's
 * full digest by name (docs/spec/fingerprint.md §8). Sent only to a get_state that asks
 * (`digests: true`): at 50k tensors it is megabytes no attach needs.
 */
export interface ManifestContent {
  fingerprint: string;
  digests: Record<string, string>;
}

/**
 * Each tensor list's packed bytes (null: it cannot be packed), for as long as a version serves it.
 * The buffer is shared by every reply of each version of that layout and never written to.
 */
const packedOf = new WeakMap<readonly TensorMeta[], Buffer | null>();

function packedTensors(tensors: readonly TensorMeta[]): Buffer | undefined {
  let packed = packedOf.get(tensors);
  if (packed === undefined) packedOf.set(tensors, (packed = toPacked(tensors) ?? null));
  return packed ?? undefined;
}

/** The JSON text of an object without its opening brace, as bytes: a reply head's fields go before it. */
function fieldBytes(fields: Record<string, unknown>): Buffer {
  return Buffer.from(JSON.stringify(fields).slice(1), 'utf8');
}

/** How a client asked for the tensors (docs/protocol.md, get_state): the newest form it knows. */
export type ManifestForm = 'objects' | 'columns' | 'packed';

/** A manifest's fields for a reply, and the frame that must follow it (the packed tensors), if any. */
export interface ManifestBytes {
  fields: Buffer;
  trailer?: Buffer;
}

export class EncodedManifest {
  readonly #head: ManifestHead;
  readonly #views: RankLayout;
  /** Undefined when the tensors cannot be packed (docs/spec/manifest-packed.md §1): columns go instead. */
  readonly #packed: ManifestBytes | undefined;
  #columns: Buffer | undefined;
  #objects: Buffer | undefined;
  readonly #content: ManifestContent | undefined;
  #contentBytes: Buffer | undefined;

  constructor(head: ManifestHead, views: RankLayout, content?: ManifestContent) {
    this.#head = head;
    this.#views = views;
    this.#content = content;
    const packed = packedTensors(views.tensors);
    this.#packed = packed && { fields: fieldBytes({ ...head, packed: packed.length, aliases: views.aliases }), trailer: packed };
  }

  /** `"content":{...},` to go before fields(), encoded on first use; undefined when the rank has no digests. */
  content(): Buffer | undefined {
    if (!this.#content) return undefined;
    if (!this.#contentBytes) {
      // Its two fields alone: a rank's `full` (servedRankData.ts) also holds its fingerprint fields.
      const { fingerprint, digests } = this.#content;
      this.#contentBytes = Buffer.from(`${JSON.stringify({ content: { fingerprint, digests } }).slice(1, -1)},`, 'utf8');
    }
    return this.#contentBytes;
  }

  /** The manifest's fields, after a reply head's own and a comma, up to the closing brace; packed, the frame to follow too. */
  encoded(form: ManifestForm): ManifestBytes {
    if (form === 'packed' && this.#packed) return this.#packed;
    if (form !== 'objects') {
      this.#columns ??= fieldBytes({ ...this.#head, columns: toColumns(this.#views.tensors), aliases: this.#views.aliases });
      return { fields: this.#columns };
    }
    this.#objects ??= fieldBytes({
      ...this.#head,
      tensors: this.#views.tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, segment: t.segment, offset: t.offset, bytes: t.bytes })),
      aliases: this.#views.aliases,
    });
    return { fields: this.#objects };
  }
}
