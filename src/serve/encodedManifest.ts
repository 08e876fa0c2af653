// One layout's manifest as the bytes every get_state reply for it carries, encoded once per form:
// at 50k tensors, serializing and encoding 7 MB of JSON per request kept a first attach waiting
// 50-125 ms for the reply's first byte. The columns (the form both reference clients ask for) are
// encoded when the rank starts serving; the objects, for clients that do not ask for columns, on
// the first request that wants them.
import type { RankLayout } from '../checkpoint/types.js';
import type { DeviceRef, RankRef, SegmentRef } from '../wire/protocol.js';
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

/** The JSON text of an object without its opening brace, as bytes: a reply head's fields go before it. */
function fieldBytes(fields: Record<string, unknown>): Buffer {
  return Buffer.from(JSON.stringify(fields).slice(1), 'utf8');
}

export class EncodedManifest {
  readonly #head: ManifestHead;
  readonly #views: RankLayout;
  readonly #columns: Buffer;
  #objects: Buffer | undefined;
  readonly #content: ManifestContent | undefined;
  #contentBytes: Buffer | undefined;

  constructor(head: ManifestHead, views: RankLayout, content?: ManifestContent) {
    this.#head = head;
    this.#views = views;
    this.#content = content;
    this.#columns = fieldBytes({ ...head, columns: toColumns(views.tensors), aliases: views.aliases });
  }

  /** `"content":{...},` to go before fields(), encoded on first use; undefined when the rank has no digests. */
  content(): Buffer | undefined {
    if (!this.#content) return undefined;
    this.#contentBytes ??= Buffer.from(`${JSON.stringify({ content: this.#content }).slice(1, -1)},`, 'utf8');
    return this.#contentBytes;
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
