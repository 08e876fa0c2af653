// One layout's manifest as the bytes every get_state reply for it carries, encoded once per form:
// at 50k tensors, serializing and encoding 7 MB of JSON per request kept a first attach waiting
// 50-125 ms for the reply's first byte. The columns (the form both reference clients ask for) are
// encoded when the rank starts serving; the objects, for clients that do not ask for columns, on
// the first request that wants them.
import type { RankLayout } from '../checkpoint/types.js';
import type { DeviceRef, RankRef, SegmentRef } from './protocol.js';
import { toColumns } from './tensorColumns.js';

/** What every form of a layout's manifest says besides its tensors. */
export interface ManifestHead {
  fingerprint: string;
  backend: 'host' | 'cuda';
  device: DeviceRef;
  rank: RankRef;
  layout: string;
  segments: SegmentRef[];
}

/** The JSON text of an object without its opening brace, as bytes: a reply head's fields go before it. */
function fieldBytes(fields: Record<string, unknown>): Buffer {
  return Buffer.from(JSON.stringify(fields).slice(1), 'utf8');
}

export class EncodedManifest {
  readonly #head: ManifestHead;
  readonly #views: RankLayout;
  readonly #columns: Buffer;
  #objects: Buffer | undefined;

  constructor(head: ManifestHead, views: RankLayout) {
    this.#head = head;
    this.#views = views;
    this.#columns = fieldBytes({ ...head, columns: toColumns(views.tensors), aliases: views.aliases });
  }

  /** The manifest's fields, after a reply head's own and a comma, up to the closing brace. */
  fields(columns: boolean): Buffer {
    if (columns) return this.#columns;
    this.#objects ??= fieldBytes({
      ...this.#head,
      tensors: this.#views.tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, segment: t.segment, offset: t.offset, bytes: t.bytes })),
      aliases: this.#views.aliases,
    });
    return this.#objects;
  }
}
