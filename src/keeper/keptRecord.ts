// What the daemon tells the keeper about a rank's kept segments, and the check a later daemon
// makes before it adopts them. The keeper stores it as opaque bytes (docs/keeper.md); only
// weightd reads it, so its format is versioned here: a daemon adopts a record of a format it
// knows and refuses any other by name, loading from disk instead (docs/operations.md, upgrades).
import { createHash } from 'node:crypto';
import { basename } from 'node:path';
import { z } from 'zod';
import { KnownLayoutName } from '../checkpoint/layouts/layoutRegistry.js';
import type { RankFillPlan } from '../checkpoint/types.js';
import { changesBetween, describeChange, type FileIdentity, type IdentityChange } from '../files/fileIdentity.js';
import type { KeptPlan } from './keptPlan.js';

/** The formats this weightd reads; it writes the last. A newer format is added here with its reader. */
export const KEPT_FORMATS = [1] as const;
export const KEPT_FORMAT = KEPT_FORMATS[KEPT_FORMATS.length - 1]!;

/**
 * The formats of a record's `written` part (a version a writer committed, docs/weight-updates.md;
 * docs/spec/kept-written.md): versioned on its own, so a change to it leaves the records of
 * checkpoint versions readable. Format 1 had no `manifest`, so nothing tied its digests to the
 * tensors a restart serves them as: it is refused, never trusted (kept-written.md §4).
 */
export const WRITTEN_FORMATS = [2] as const;
export const WRITTEN_FORMAT = WRITTEN_FORMATS[WRITTEN_FORMATS.length - 1]!;

const digest = z.string().regex(/^[0-9a-f]{32}$/);

/** What a restart needs to serve a written version with no checkpoint file for its bytes. */
const writtenSchema = z.object({
  format: z.number().int(),
  /** The model's name and the version's number among its versions. */
  name: z.string().min(1),
  version: z.number().int().positive(),
  /** The model fingerprint of the version it was written over. */
  base: z.string().min(1),
  /** The version's §9 fields (docs/spec/fingerprint.md): its fingerprint is recomputed from them and every rank's digests. */
  fields: z.record(z.string(), z.string()),
  /** This rank's tensors' digests, in its manifest's order, as the commit computed them. */
  digests: z.array(digest),
  /** The digest of the model's manifest, every rank's (writtenIdentity.ts, manifestDigest): a restart serves the digests and bytes only as the same tensors. */
  manifest: z.string().regex(/^[0-9a-f]{64}$/),
  /** The positions of the segments that are the base's own memory (shared at the commit, not copied): kept once, by every version that shares them. */
  shared: z.array(z.number().int().nonnegative()),
});

export type KeptWritten = z.infer<typeof writtenSchema>;

/** How a kept segment's descriptor is to be opened: a sealed memfd, or a CUDA VMM allocation. */
export type KeptHandleType = 'memfd' | 'cuda-fd';

const identitySchema = z.object({ path: z.string(), dev: z.string(), ino: z.string(), size: z.number().int().nonnegative(), mtimeNs: z.string(), ctimeNs: z.string() });

/** keptPlan.ts's KeptPlan (docs/spec/kept-plan.md §3). */
const planSchema = z.object({
  format: z.number().int(),
  key: z.string().regex(/^[0-9a-f]{64}$/),
  // planner: '' in a plan kept by a build before the planning code was in the key, so that the
  // start says it is another planner's (docs/spec/kept-plan.md §2) rather than malformed.
  fields: z.object({ planFormat: z.number().int(), writer: z.string(), planner: z.string().default(''), modelDir: z.string(), tpSize: z.number().int().positive(), planFile: z.string().nullable(), layouts: z.array(z.string()) }),
  inputs: z.array(identitySchema),
  ranks: z.array(z.string()),
  bytes: z.number().int().nonnegative(),
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
  brotli: z.string(),
}) satisfies z.ZodType<KeptPlan>;

const recordSchema = z.object({
  format: z.number().int(),
  writer: z.string(),
  backend: z.enum(['host', 'cuda']),
  handleType: z.enum(['memfd', 'cuda-fd']),
  device: z.string().min(1),
  fingerprint: z.string().min(1),
  /** Digest of where every byte of the arena comes from (arenaDigest): same plan, same arena. */
  arena: z.string().length(64),
  segments: z.array(z.number().int().nonnegative()).min(1),
  totalBytes: z.number().int().nonnegative(),
  model: z.string(),
  tpRank: z.number().int().nonnegative(),
  tpSize: z.number().int().positive(),
  keptAt: z.string(),
  /**
   * Each checkpoint file's identity when the kept bytes were planned (src/files/fileIdentity.ts).
   * Optional to parse, so a record of an older daemon is still read (for its `load`); never
   * adopted without it (checkKeptRecord).
   */
  files: z.array(identitySchema).optional(),
  /** The plan's contentTensors' full digests, in order, as the fill computed them (docs/spec/fingerprint.md §8); absent from an older daemon's record. */
  digests: z.array(digest).optional(),
  /** A model loaded at run time (weightd ctl load): how to plan it again, so a restart restores it (restoreLoaded.ts). */
  load: z.object({ name: z.string().min(1), modelDir: z.string().min(1), tpSize: z.number().int().positive(), planFile: z.string().optional(), layouts: z.array(KnownLayoutName), fingerprint: z.string().min(1) }).optional(),
  /**
   * The whole model's plan, on the record of its local rank 0 (src/keeper/keptPlan.ts): what a
   * restart plans from instead of the headers. Parsed on its own (keptPlanIn), so that a record
   * whose plan field is malformed is still adopted; a weightd that predates it strips it.
   */
  plan: z.unknown().optional(),
  /** When the version became current last (ms since the epoch), if it did since it was loaded: a restart makes the version of the latest current again. */
  currentSince: z.number().int().nonnegative().optional(),
  /** A version a writer committed (its `files` are empty: no checkpoint file holds its bytes); absent for a checkpoint's. */
  written: writtenSchema.optional(),
});

export type KeptRecord = z.infer<typeof recordSchema>;

/** The load request a record of a model loaded at run time carries: its ModelSpec and its checkpoint fingerprint. */
export type KeptLoad = NonNullable<KeptRecord['load']>;

/** What a rank expects of a record it would adopt. */
export interface KeptExpectation {
  backend: 'host' | 'cuda';
  handleType: KeptHandleType;
  device: string;
  plan: RankFillPlan;
  /** The checkpoint files' identity as this start planned them. */
  files: FileIdentity[];
}

/**
 * A digest of the arena's byte placement: segment sizes, every copy (file by name, source and
 * destination offsets, rows) and every zero range. The fingerprint says the checkpoint is the
 * same; this says the arena was laid out the same way (layouts, plan rules), so the bytes are
 * where the plan says. File names, not paths: a checkpoint moved to another directory adopts.
 */
export function arenaDigest(plan: RankFillPlan): string {
  const files = plan.files.map((f) => basename(f));
  const ops = plan.ops.map((o) => [files[o.file], o.segment, o.srcOffset, o.dstOffset, o.rows, o.rowBytes, o.srcPitch]);
  const zeros = plan.zeroRanges.map((z) => [z.segment, z.offset, z.bytes]);
  return createHash('sha256').update(JSON.stringify({ segments: plan.segments, ops, zeros })).digest('hex');
}

export function keptRecordFor(
  e: KeptExpectation,
  model: string,
  writer: string,
  load?: KeptLoad,
  digests: readonly string[] = [],
  plan?: KeptPlan,
  now = new Date(),
  { written, currentSince }: { written?: KeptWritten; currentSince?: number } = {},
): KeptRecord {
  return {
    format: KEPT_FORMAT,
    writer,
    backend: e.backend,
    handleType: e.handleType,
    device: e.device,
    fingerprint: e.plan.fingerprint,
    arena: arenaDigest(e.plan),
    segments: e.plan.segments,
    totalBytes: e.plan.totalBytes,
    model,
    tpRank: e.plan.tpRank,
    tpSize: e.plan.tpSize,
    keptAt: now.toISOString(),
    files: e.files,
    ...(digests.length > 0 ? { digests: [...digests] } : {}),
    ...(load ? { load } : {}),
    ...(plan ? { plan } : {}),
    ...(currentSince !== undefined ? { currentSince } : {}),
    ...(written ? { written } : {}),
  };
}

/** A kept record's plan (absent when it carries none), or why the record or its plan field cannot be read. */
/**
 * A record is parsed once (parseKeptRecord caches it by its bytes), so zod's compiled fast path
 * for an object's shape would be built for one use: at a restart that adopts, that compile was
 * 3 of the record's 6 ms on the development VM (bench/RESULTS.md, issue 33).
 */
const ONCE = { jitless: true } as const;

export function keptPlanIn(bytes: Buffer): { plan?: KeptPlan } | { refusal: string } {
  const parsed = parseKeptRecord(bytes);
  if ('refusal' in parsed) return { refusal: parsed.refusal.message };
  const { plan } = parsed.record;
  if (plan === undefined) return {};
  const checked = planSchema.safeParse(plan, ONCE);
  if (!checked.success) {
    const issue = checked.error.issues[0]!;
    return { refusal: `the kept record's plan is malformed at ${issue.path.join('.') || '(root)'}: ${issue.message}` };
  }
  return { plan: checked.data };
}

export function encodeKeptRecord(r: KeptRecord): Buffer {
  return Buffer.from(JSON.stringify(r), 'utf8');
}

/** Why a record cannot be adopted, for the log and the status; undefined when it can. */
export type Refusal = { field: string; message: string; changes?: IdentityChange[] };

type Parsed = { record: KeptRecord } | { refusal: Refusal };

/**
 * Records parsed in this thread, by their bytes: a start reads each record of its LIST for the
 * plan lookup and the restore of loaded models, and its TAKE hands the same bytes back to adopt.
 * At 50,000 tensors a record is megabytes of JSON, so each distinct record is parsed once
 * (a TAKE's bytes are matched to a listed record's by comparing them, not parsed again). Weak:
 * a record nobody holds any more is forgotten. Callers never change what it returns.
 */
const parsedByBytes = new WeakMap<Buffer, Parsed>();
const parsedBySize = new Map<number, Array<WeakRef<Buffer>>>();

function parsedBefore(bytes: Buffer): Parsed | undefined {
  const same = parsedByBytes.get(bytes);
  if (same) return same;
  const refs = parsedBySize.get(bytes.length);
  if (!refs) return undefined;
  const live = refs.filter((r) => r.deref() !== undefined);
  if (live.length === 0) parsedBySize.delete(bytes.length);
  else parsedBySize.set(bytes.length, live);
  for (const ref of live) {
    const seen = ref.deref();
    if (seen?.equals(bytes)) return parsedByBytes.get(seen);
  }
  return undefined;
}

/** Reads a record, refusing (never throwing) one that is not JSON, of a format this weightd does not read, or malformed, naming why. */
export function parseKeptRecord(bytes: Buffer): Parsed {
  let parsed = parsedBefore(bytes);
  if (parsed === undefined) {
    parsed = parseRecordBytes(bytes);
    parsedBySize.set(bytes.length, [...(parsedBySize.get(bytes.length) ?? []), new WeakRef(bytes)]);
  }
  parsedByBytes.set(bytes, parsed);
  return parsed;
}

function parseRecordBytes(bytes: Buffer): Parsed {
  let value: unknown;
  try {
    value = JSON.parse(bytes.toString('utf8'));
  } catch {
    return { refusal: { field: 'record', message: `the kept record (${bytes.length} bytes) is not JSON: it is corrupt or not weightd's` } };
  }
  const format = (value as { format?: unknown } | null)?.format;
  if (typeof format !== 'number' || !(KEPT_FORMATS as readonly number[]).includes(format)) {
    const writer = (value as { writer?: unknown } | null)?.writer;
    return {
      refusal: {
        field: 'format',
        message: `the kept record is in format ${JSON.stringify(format)}${typeof writer === 'string' ? ` (written by ${writer})` : ''}, and this weightd reads formats ${KEPT_FORMATS.join(', ')}`,
      },
    };
  }
  const written = (value as { written?: { format?: unknown; name?: unknown; version?: unknown } }).written;
  if (written !== undefined && !(WRITTEN_FORMATS as readonly unknown[]).includes(written?.format)) {
    return {
      refusal: {
        field: 'written.format',
        message: `the kept record of written version ${JSON.stringify(written?.version)} of model ${JSON.stringify(written?.name)} is in written format ${JSON.stringify(written?.format)}, and this weightd reads written formats ${WRITTEN_FORMATS.join(', ')}`,
      },
    };
  }
  const parsed = recordSchema.safeParse(value, ONCE);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    return { refusal: { field: 'record', message: `the kept record is malformed at ${issue.path.join('.') || '(root)'}: ${issue.message}` } };
  }
  return { record: parsed.data };
}

/** Reads a record and checks it against what this rank would load (parseKeptRecord), refusing a record for another arena by the field that differs. */
export function checkKeptRecord(bytes: Buffer, e: KeptExpectation): Parsed {
  const parsed = parseKeptRecord(bytes);
  if ('refusal' in parsed) return parsed;
  const r = parsed.record;
  const expected: Array<[keyof KeptRecord, unknown, unknown]> = [
    ['backend', r.backend, e.backend],
    ['handleType', r.handleType, e.handleType],
    ['device', r.device, e.device],
    ['fingerprint', r.fingerprint, e.plan.fingerprint],
    ['arena', r.arena, arenaDigest(e.plan)],
    ['segments', JSON.stringify(r.segments), JSON.stringify(e.plan.segments)],
    ['totalBytes', r.totalBytes, e.plan.totalBytes],
  ];
  for (const [field, kept, wanted] of expected) {
    if (kept !== wanted) return { refusal: { field, message: `the kept record's ${field} is ${String(kept).slice(0, 80)}, and this rank needs ${String(wanted).slice(0, 80)}` } };
  }
  const tensors = e.plan.contentTensors.names.length;
  if (r.digests !== undefined && r.digests.length !== tensors) {
    return { refusal: { field: 'digests', message: `the kept record has ${r.digests.length} tensor digests, and this rank's checkpoint has ${tensors} tensors` } };
  }
  if (r.files === undefined) {
    return { refusal: { field: 'files', message: `the kept record carries no identity of the checkpoint files (written by ${r.writer.slice(0, 80)}, older than that check), so its bytes cannot be shown to be the files' now` } };
  }
  // Each file's identity is checked against this plan's, in order: a record that names fewer
  // (none, say) would leave the others unchecked.
  if (r.files.length !== e.files.length) {
    return { refusal: { field: 'files', message: `the kept record names ${r.files.length} checkpoint file(s), and this rank's plan reads ${e.files.length}, so its bytes cannot be shown to be every file's now` } };
  }
  const changes = changesBetween(r.files, e.files);
  if (changes.length > 0) {
    return { refusal: { field: 'files', message: `the checkpoint files changed since the shard was kept (${changes.map(describeChange).join('; ')})`, changes } };
  }
  return { record: r };
}
