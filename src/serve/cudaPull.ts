// A pull update (docs/weight-updates.md, "Pulling from the writer's tensors"): on cuda, a writer
// whose new weights already lie on the rank's GPU names their memory (legacy CUDA IPC handles of
// its cudaMalloc'd allocations, with offsets) instead of writing staging segments, and the commit
// copies them once, device to device, straight into the new version's final allocations, which no
// writer ever maps. This file checks what a writer names (JS validates everything before the
// addon sees it) and turns it into the commit's copies; cudaUpdateSegments.ts runs them.
import { ServeError } from '../errors.js';
import type { CommitCopy } from '../native/fillRecords.js';
import { refuseUnlessCudaFd } from './cudaUpdateSegments.js';
import type { RankService } from './rankService.js';

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
 * rank's own GPU (`device`, its UUID), and no `tensors` list (a pull names its tensors as it pulls).
 */
export function refuseUnlessPullable(service: RankService, device: string | undefined, tensors: readonly string[] | undefined): void {
  const { rank } = service;
  if (rank.backend !== 'cuda') {
    throw new ServeError(
      'E_UPDATE_UNSUPPORTED',
      `model "${rank.name}" serves from host memory: a pull copies a writer's GPU memory, on the cuda backend only; write the update's segments instead (begin_update without source)`,
      { model: rank.name, backend: rank.backend },
    );
  }
  refuseUnlessCudaFd(service);
  if (tensors) {
    throw new ServeError('E_BAD_REQUEST', `begin_update with source "pull" takes no tensors list: the tensors pull_tensors names are the ones written, and the segments holding them the ones copied`, {
      model: rank.name,
    });
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
  const layout = new Map(rank.tensors.map((t) => [t.name, t]));
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

/**
 * The commit's copies for a pull: each pulled tensor from its source (k + 1), and every byte
 * between them in a copied segment (up to its `bytes`) from the base's segment (source 0), so each
 * final is written once, whole.
 */
export function pullCopies(service: RankService, pull: Pull, copied: readonly boolean[]): CommitCopy[] {
  const { rank } = service;
  const position = new Map(rank.segments.map((s, i) => [s.segment, i]));
  const copies: CommitCopy[] = [];
  const bySegment = rank.segments.map(() => [] as { offset: number; bytes: number; source: number; srcOffset: number }[]);
  for (const t of rank.tensors) {
    const p = pull.tensors.get(t.name);
    if (p) bySegment[position.get(t.segment)!]!.push({ offset: t.offset, bytes: t.bytes, source: p.source + 1, srcOffset: p.offset });
  }
  // A copy that continues the one before it in both source and destination extends it: a trainer's
  // tensors packed as the layout packs them become one copy per run, not one per tensor (each
  // queued copy costs the driver microseconds, and a model may have 100k tensors).
  const add = (c: CommitCopy) => {
    const last = copies[copies.length - 1];
    if (last && last.segment === c.segment && last.source === c.source && last.srcOffset + last.bytes === c.srcOffset && last.dstOffset + last.bytes === c.dstOffset) last.bytes += c.bytes;
    else if (c.bytes > 0) copies.push(c);
  };
  rank.segments.forEach((s, segment) => {
    if (!copied[segment]) return;
    let cursor = 0;
    for (const t of bySegment[segment]!.sort((a, b) => a.offset - b.offset)) {
      if (t.offset > cursor) add({ segment, source: 0, srcOffset: cursor, dstOffset: cursor, bytes: t.offset - cursor });
      add({ segment, source: t.source, srcOffset: t.srcOffset, dstOffset: t.offset, bytes: t.bytes });
      cursor = Math.max(cursor, t.offset + t.bytes);
    }
    if (s.bytes > cursor) add({ segment, source: 0, srcOffset: cursor, dstOffset: cursor, bytes: s.bytes - cursor });
  });
  return copies;
}

/**
 * One pull_tensors request's copies, run as soon as it is recorded (the writer keeps its tensors
 * unchanged until the commit's reply): its sources (the IPC handles, decoded), the copies of its
 * tensors from them (source k + 1: `sources[k]`), and the segments they write, each needing a final.
 * The bytes between pulled tensors are the commit's (commitGaps): only then is every tensor named.
 */
export function batchPlan(service: RankService, sources: readonly string[], tensors: readonly PulledTensor[]): { sources: Buffer[]; copies: CommitCopy[]; segments: boolean[] } {
  // Only the handles its tensors use are opened (as recordPulls keeps only those).
  const batch: Pull = { sources: [], sourceIndex: new Map(), tensors: new Map() };
  recordPulls(service, batch, sources, tensors);
  const segments = pulledSegments(service, batch);
  return { sources: batch.sources.map((h) => Buffer.from(h, 'base64')), copies: pullCopies(service, batch, segments).filter((c) => c.source > 0), segments };
}

/** The commit's copies for `pull` over the segments `copied` once every pulled tensor is in place: the bytes between them, from the base (source 0). */
export function commitGaps(service: RankService, pull: Pull, copied: readonly boolean[]): CommitCopy[] {
  return pullCopies(service, pull, copied).filter((c) => c.source === 0);
}
