// A pull update (docs/weight-updates.md, "Pulling from the writer's tensors"): on cuda, a writer
// whose new weights already lie on the rank's GPU names their memory (legacy CUDA IPC handles of
// its cudaMalloc'd allocations, with offsets) instead of writing staging segments, and the commit
// copies them once, device to device, straight into the new version's final allocations, which no
// writer ever maps. This file checks what a writer names (JS validates everything before the
// addon sees it) and turns it into the commit's copies; cudaUpdateSegments.ts runs them.
import { ServeError } from '../errors.js';
import type { TensorEntry, ZeroRange } from '../checkpoint/types.js';
import type { CommitCopy } from '../native/fillRecords.js';
import { refuseUnlessCudaFd, type BatchPlan } from './cudaUpdateSegments.js';
import type { RankService } from './rankService.js';
import { tensorsByName } from './tensorsByName.js';

/** A tensor a pull_tensors request names: `bytes` at `offset` of the allocation behind its request's `sources[source]`. */
export interface PulledTensor {
  name: string;
  source: number;
  offset: number;
  bytes: number;
}

/** What a rank's part of a pull update has been told so far. */
export interface Pull {
  /** The distinct IPC handles (base64), in the order the commit opens them. */
  sources: string[];
  sourceIndex: Map<string, number>;
  /** By tensor name: which of `sources`, and where in it. */
  tensors: Map<string, { source: number; offset: number }>;
}

/** A GPU UUID as the driver spells it ("GPU-…") or nvidia-smi does, compared without case or prefix. */
const uuidKey = (uuid: string) => uuid.toLowerCase().replace(/^gpu-/, '');

/**
 * Refuses a pull where one cannot be: the cuda backend with descriptors only (a pull reads GPU
 * memory, and its version is adopted by descriptor as any update's), the writer's memory on the
 * rank's own GPU (`device`, its UUID), and a `tensors` list without `prepare` (a pull names its
 * tensors as it pulls; a list only says which segments' finals to prepare at begin).
 */
export function refuseUnlessPullable(service: RankService, device: string | undefined, tensors: readonly string[] | undefined, prepare = false): void {
  const { rank } = service;
  if (rank.backend !== 'cuda') {
    throw new ServeError(
      'E_UPDATE_UNSUPPORTED',
      `model "${rank.name}" serves from host memory: a pull copies a writer's GPU memory, on the cuda backend only; write the update's segments instead (begin_update without source)`,
      { model: rank.name, backend: rank.backend },
    );
  }
  refuseUnlessCudaFd(service);
  if (tensors && !prepare) {
    throw new ServeError(
      'E_BAD_REQUEST',
      `begin_update with source "pull" takes a tensors list only with prepare: the tensors pull_tensors names are the ones written; add prepare: true to make the finals of the listed tensors' segments at begin, or drop the list`,
      { model: rank.name },
    );
  }
  if (!device) throw new ServeError('E_BAD_REQUEST', `begin_update with source "pull" needs device: the UUID of the GPU the writer's tensors are on`, { model: rank.name });
  if (uuidKey(device) !== uuidKey(rank.device.uuid)) {
    throw new ServeError(
      'E_DEVICE_MISMATCH',
      `the writer's tensors are on GPU ${device}, but rank ${rank.globalRank} of model "${rank.name}" serves from ${rank.device.uuid}: a pull copies within one GPU; ` +
        "pull on the socket of the writer's own GPU, or write the staging segments (begin_update without source)",
      { model: rank.name, uuid: device, daemonUuid: rank.device.uuid },
    );
  }
}

/**
 * Adds one pull_tensors request's tensors to `pull`, once every one of them is checked: a name of
 * the rank's checkpoint layout (E_UNKNOWN_TENSOR), not pulled before (E_BAD_REQUEST), its whole
 * size (E_UPDATE_SIZE), a source of the request (E_BAD_REQUEST). Where each lies in its source is
 * checked at commit, against the allocation the driver opens (E_UPDATE_SIZE there).
 */
export function recordPulls(service: RankService, pull: Pull, sources: readonly string[], tensors: readonly PulledTensor[]): void {
  const { rank } = service;
  const layout = tensorsByName(rank.tensors);
  const seen = new Set<string>();
  for (const t of tensors) {
    const meta = layout.get(t.name);
    if (!meta) {
      throw new ServeError(
        'E_UNKNOWN_TENSOR',
        `pull_tensors names tensor "${t.name}", which rank ${rank.globalRank} of model "${rank.name}" does not hold; pull tensors of the base's checkpoint layout (begin_update's reply lists them)`,
        { model: rank.name, tensor: t.name },
      );
    }
    if (seen.has(t.name) || pull.tensors.has(t.name)) {
      throw new ServeError('E_BAD_REQUEST', `pull_tensors names tensor "${t.name}" a second time in this update; pull each tensor once`, { model: rank.name, tensor: t.name });
    }
    seen.add(t.name);
    if (t.bytes !== meta.bytes) {
      throw new ServeError(
        'E_UPDATE_SIZE',
        `pull_tensors gives tensor "${t.name}" ${t.bytes} bytes, but it holds ${meta.bytes} (${meta.dtype} [${meta.shape.join(', ')}]); pull the whole tensor, in its dtype and shape`,
        { model: rank.name, tensor: t.name, bytes: t.bytes, expected: meta.bytes },
      );
    }
    if (t.source >= sources.length) {
      throw new ServeError('E_BAD_REQUEST', `pull_tensors tensor "${t.name}" names source ${t.source}, but the request lists ${sources.length}`, { model: rank.name, tensor: t.name });
    }
  }
  for (const t of tensors) {
    const handle = sources[t.source]!;
    let source = pull.sourceIndex.get(handle);
    if (source === undefined) {
      source = pull.sources.push(handle) - 1;
      pull.sourceIndex.set(handle, source);
    }
    pull.tensors.set(t.name, { source, offset: t.offset });
  }
}

/** Which of the rank's segments (by position) a pull writes: those holding a pulled tensor. */
export function pulledSegments(service: RankService, pull: Pull): boolean[] {
  const { rank } = service;
  const position = new Map(rank.segments.map((s, i) => [s.segment, i]));
  const copied = rank.segments.map(() => false);
  for (const t of rank.tensors) if (pull.tensors.has(t.name)) copied[position.get(t.segment)!] = true;
  return copied;
}

/** The rank's tensors whose bytes a pull changes (by the layout's order): the pulled ones, and any other that shares bytes with one. */
export function rehashedUnderPull(service: RankService, pull: Pull): boolean[] {
  const { rank } = service;
  // Per segment, the pulled bytes as sorted disjoint ranges (so their ends rise too).
  const pulled = new Map<number, { start: number; end: number }[]>();
  const sorted = rank.tensors.filter((t) => pull.tensors.has(t.name) && t.bytes > 0).sort((a, b) => a.segment - b.segment || a.offset - b.offset);
  for (const t of sorted) {
    const ranges = pulled.get(t.segment) ?? pulled.set(t.segment, []).get(t.segment)!;
    const last = ranges[ranges.length - 1];
    if (last && t.offset <= last.end) last.end = Math.max(last.end, t.offset + t.bytes);
    else ranges.push({ start: t.offset, end: t.offset + t.bytes });
  }
  const overlaps = (segment: number, start: number, end: number) => {
    const ranges = pulled.get(segment);
    if (!ranges || end <= start) return false;
    let lo = 0;
    let hi = ranges.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (ranges[mid]!.end <= start) lo = mid + 1;
      else hi = mid;
    }
    return lo < ranges.length && ranges[lo]!.start < end;
  };
  return rank.tensors.map((t) => pull.tensors.has(t.name) || overlaps(t.segment, t.offset, t.offset + t.bytes));
}

/** A byte range [start, end) of one segment. */
interface Span {
  start: number;
  end: number;
}

/** Sorted, disjoint, non-empty spans covering the same bytes as `spans`. */
function merged(spans: Span[]): Span[] {
  const out: Span[] = [];
  for (const s of [...spans].sort((a, b) => a.start - b.start)) {
    if (s.end <= s.start) continue;
    const last = out[out.length - 1];
    if (last && s.start <= last.end) last.end = Math.max(last.end, s.end);
    else out.push({ ...s });
  }
  return out;
}

/** The bytes of sorted disjoint `from` that sorted disjoint `minus` does not cover. */
function without(from: Span[], minus: Span[]): Span[] {
  const out: Span[] = [];
  let m = 0;
  for (const f of from) {
    let start = f.start;
    while (m < minus.length && minus[m]!.end <= start) m++;
    for (let k = m; k < minus.length && minus[k]!.start < f.end; k++) {
      if (minus[k]!.start > start) out.push({ start, end: minus[k]!.start });
      start = Math.max(start, minus[k]!.end);
    }
    if (start < f.end) out.push({ start, end: f.end });
  }
  return out;
}

/** Per segment (by position): the spans of its tensors `pulled` names and of its other tensors, merged. */
function spansBySegment(service: RankService, pulled: (name: string) => boolean): { pulled: Span[]; others: Span[] }[] {
  const { rank } = service;
  const position = new Map(rank.segments.map((s, i) => [s.segment, i]));
  const raw = rank.segments.map(() => ({ pulled: [] as Span[], others: [] as Span[] }));
  for (const t of rank.tensors) raw[position.get(t.segment)!]![pulled(t.name) ? 'pulled' : 'others'].push({ start: t.offset, end: t.offset + t.bytes });
  return raw.map((r) => ({ pulled: merged(r.pulled), others: merged(r.others) }));
}

/**
 * A pull's copies of its tensors from their sources (k + 1). A copy that continues the one before
 * it in both source and destination extends it: a trainer's tensors packed as the layout packs
 * them become one copy per run, not one per tensor (each queued copy costs the driver
 * microseconds, and a model may have 100k tensors).
 */
export function pulledCopies(service: RankService, pull: Pull): CommitCopy[] {
  const { rank } = service;
  const position = new Map(rank.segments.map((s, i) => [s.segment, i]));
  const copies: CommitCopy[] = [];
  const pulled = rank.tensors
    .flatMap((t) => {
      const p = pull.tensors.get(t.name);
      return p && t.bytes > 0 ? [{ segment: position.get(t.segment)!, source: p.source + 1, srcOffset: p.offset, dstOffset: t.offset, bytes: t.bytes }] : [];
    })
    .sort((a, b) => a.segment - b.segment || a.dstOffset - b.dstOffset);
  for (const c of pulled) {
    const last = copies[copies.length - 1];
    if (last && last.segment === c.segment && last.source === c.source && last.srcOffset + last.bytes === c.srcOffset && last.dstOffset + last.bytes === c.dstOffset) last.bytes += c.bytes;
    else copies.push(c);
  }
  return copies;
}

/**
 * The commit's copies for `pull` over the segments `copied`, once every pulled tensor is in place:
 * the bytes of the other tensors there that no pulled tensor covers, from the base (source 0). A
 * full update has none, so its commit copies nothing and maps no final.
 */
export function commitGaps(service: RankService, pull: Pull, copied: readonly boolean[]): CommitCopy[] {
  return spansBySegment(service, (name) => pull.tensors.has(name)).flatMap(({ pulled, others }, segment) =>
    copied[segment] ? without(others, pulled).map((s) => ({ segment, source: 0, srcOffset: s.start, dstOffset: s.start, bytes: s.end - s.start })) : [],
  );
}

/**
 * The bytes of the segments `segments` that no tensor holds (alignment between tensors, padding,
 * the tail), which a pull writes as zeros into their finals: they belong to no tensor, so no reader
 * sees them, and zeros need no read of the base.
 */
export function untensoredBytes(service: RankService, segments: readonly boolean[]): ZeroRange[] {
  const spans = spansBySegment(service, () => false);
  return service.rank.segments.flatMap((s, segment) =>
    segments[segment] ? without([{ start: 0, end: s.bytes }], spans[segment]!.others).map((z) => ({ segment, offset: z.start, bytes: z.end - z.start })) : [],
  );
}

/**
 * One pull_tensors request's copies, run as soon as it is recorded (the writer keeps its tensors
 * unchanged until the commit's reply), with zeros where no tensor of its segments is. The other
 * tensors' bytes are the commit's (commitGaps): only then is every tensor named. Its tensors that
 * share no byte with another tensor are digested right after the copies (a tensor is pulled once,
 * and no later pull or gap copy writes its bytes), so the commit neither maps their finals nor
 * hashes them again; one that shares bytes (an alias) is digested at commit, once every pull has
 * written.
 */
export function batchPlan(service: RankService, sources: readonly string[], tensors: readonly PulledTensor[]): BatchPlan {
  // Only the handles its tensors use are opened (as recordPulls keeps only those).
  const batch: Pull = { sources: [], sourceIndex: new Map(), tensors: new Map() };
  recordPulls(service, batch, sources, tensors);
  const segments = pulledSegments(service, batch);
  const { rank } = service;
  const position = new Map(rank.segments.map((s, i) => [s.segment, i]));
  const sharing = bytesShared(rank.tensors);
  const digested = rank.tensors.flatMap((t, index) =>
    batch.tensors.has(t.name) && !sharing[index] ? [{ index, range: { file: position.get(t.segment)!, start: t.offset, end: t.offset + t.bytes } }] : [],
  );
  return { pulled: batch.tensors, sources: batch.sources.map((h) => Buffer.from(h, 'base64')), copies: pulledCopies(service, batch), segments, zeros: untensoredBytes(service, segments), digested };
}

/** Per tensor (by the layout's order): whether it shares a byte with another tensor of its segment. Computed once per layout. */
const sharedBytes = new WeakMap<readonly TensorEntry[], boolean[]>();
function bytesShared(tensors: readonly TensorEntry[]): boolean[] {
  let shared = sharedBytes.get(tensors);
  if (shared) return shared;
  shared = tensors.map(() => false);
  const order = tensors.map((_, i) => i).filter((i) => tensors[i]!.bytes > 0);
  order.sort((a, b) => tensors[a]!.segment - tensors[b]!.segment || tensors[a]!.offset - tensors[b]!.offset);
  // Sorted by start: a tensor overlaps an earlier one exactly when it starts before the furthest end so far.
  let furthest = { segment: -1, end: 0, index: -1 };
  for (const i of order) {
    const t = tensors[i]!;
    if (t.segment === furthest.segment && t.offset < furthest.end) {
      shared[i] = true;
      shared[furthest.index] = true;
    }
    if (t.segment !== furthest.segment || t.offset + t.bytes > furthest.end) furthest = { segment: t.segment, end: t.offset + t.bytes, index: i };
  }
  sharedBytes.set(tensors, shared);
  return shared;
}
