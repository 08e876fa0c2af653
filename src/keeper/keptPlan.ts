// A model's plan kept beside its shards (docs/spec/kept-plan.md), so that a restart whose shards
// the keeper holds takes the plan from there instead of reading and checking every safetensors
// header and sampling content again (issue 33): at 5,286 tensors on the development VM, 290-980
// ms of a restart against 36-183 ms (bench/RESULTS.md). The plan rides in the kept record of the
// model's local rank 0 (its `plan` field, brotli, base64): the keeper stores it as opaque bytes, so its wire is
// unchanged and a keeper of any build carries it; a daemon that does not know the field ignores
// it (the record's schema strips what it does not name). It is used only when it is right:
// its key (the options that shape a plan, the plan format, weightd's version, the planning code's digest) equals this
// start's, every file planning reads has the stat identity it had (docs/spec/file-identity.md),
// every local rank's shard is kept, and its bytes are the ones kept (SHA-256). Anything else plans
// from the headers, with a debug line saying why.
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { brotliCompress, brotliDecompress, constants } from 'node:zlib';
import { canonicalJson } from '../checkpoint/canonicalJson.js';
import { INDEX_FILE } from '../checkpoint/readCheckpointIndex.js';
import type { CheckpointPlan, LayoutName } from '../checkpoint/types.js';
import { changedFiles, describeChange, fileIdentities, type FileIdentity } from '../files/fileIdentity.js';
import type { KeptRecord as ListedRecord } from './keeperProtocol.js';

/** What of a model's spec (src/models/modelSpecs.ts) shapes its plan: the keeper sits below models, so it names the fields itself. */
interface PlanShapingSpec {
  modelDir: string;
  tpSize: number;
  planFile?: string;
  layouts: LayoutName[];
}

/**
 * The plan format: bumped when CheckpointPlan's shape changes (a change to what a planning rule
 * produces changes the key anyway: the planning code's digest is in it, plannerDigest).
 */
export const KEPT_PLAN_FORMAT = 1;

/** What a plan is made from besides the files' bytes: one field differing is another plan. */
export interface PlanKeyFields {
  planFormat: number;
  /** weightd and its version ("weightd 0.1.0"): another release may plan differently. */
  writer: string;
  /** The planning code's digest (plannerDigest): another build of the same version may plan differently. */
  planner: string;
  modelDir: string;
  tpSize: number;
  planFile: string | null;
  layouts: string[];
}

/** The `plan` field of a kept record (keptRecord.ts), as docs/spec/kept-plan.md §3 writes it. */
export interface KeptPlan {
  format: number;
  /** sha256 of the canonical JSON of `fields` (planKey). */
  key: string;
  fields: PlanKeyFields;
  /** Every file planning read, as stat'ed before it read any: the directory, config.json, the index, the plan file, each safetensors file. */
  inputs: FileIdentity[];
  /** Each tp rank's fingerprint, so the shards can be looked for before the plan is unpacked. */
  ranks: string[];
  /** The plan's JSON: its byte length and SHA-256, and the bytes, brotli then base64. */
  bytes: number;
  sha256: string;
  brotli: string;
}

export function planKeyFields(spec: PlanShapingSpec, writer: string, planner = thisPlanner()): PlanKeyFields {
  return { planFormat: KEPT_PLAN_FORMAT, writer, planner, modelDir: spec.modelDir, tpSize: spec.tpSize, planFile: spec.planFile ?? null, layouts: [...spec.layouts] };
}

/** The module planning starts from, relative to the compiled src/ folder. */
export const PLANNER_ENTRY = 'checkpoint/planCheckpoint.js';
/** A relative specifier a module loads: a static or dynamic import, a re-export, or a worker it names by URL (parseShards' header worker). */
const LOADS = /(?:\bfrom\s*|\bimport\s*\(?\s*|\bnew URL\(\s*)['"](\.\.?\/[^'"]+\.js)['"]/g;

/**
 * The compiled modules planning runs: `entry` and every module it loads, transitively, as paths
 * relative to `root` (the compiled src/ folder), sorted. Packages (zod, piscina) are not followed:
 * their versions come with weightd's (the `writer` field).
 */
export function plannerModules(root: string, entry = PLANNER_ENTRY): string[] {
  const seen = new Set<string>();
  const visit = (rel: string) => {
    if (seen.has(rel)) return;
    seen.add(rel);
    for (const [, spec] of readFileSync(join(root, rel), 'utf8').matchAll(LOADS)) {
      const next = relative(root, resolve(dirname(join(root, rel)), spec!));
      // A specifier in a comment or string that names no module is not one planning loads.
      if (!next.startsWith('..') && existsSync(join(root, next))) visit(next);
    }
  };
  visit(entry);
  return [...seen].sort();
}

/**
 * The SHA-256 of the planning code under `root` (plannerModules: each one's path, then its
 * bytes, in path order). A version names a release, not a build: two builds of one version (a
 * sharding rule fixed between them, say, or the bounded JSON reader planning parses headers with)
 * may plan the same files differently, and a plan the other one kept would serve that build's
 * layout again (docs/spec/kept-plan.md §2).
 */
export function plannerDigest(root: string, entry = PLANNER_ENTRY): string {
  const hash = createHash('sha256');
  for (const f of plannerModules(root, entry)) hash.update(`${f}\0`).update(readFileSync(join(root, f))).update('\0');
  return hash.digest('hex');
}

/** In dist/main.cjs, the digest of the modules it was bundled from (scripts/bundle-main.mjs); undeclared elsewhere. */
declare const __BUNDLED_PLANNER_DIGEST__: string | undefined;
let planner: string | undefined;
/** This build's planning code's digest, taken once (~150 KB read and scanned: 4 ms on the development VM), or the bundle's. */
const thisPlanner = () => (planner ??= typeof __BUNDLED_PLANNER_DIGEST__ === 'string' ? __BUNDLED_PLANNER_DIGEST__ : plannerDigest(fileURLToPath(new URL('../', import.meta.url))));

export function planKey(fields: PlanKeyFields): string {
  return createHash('sha256').update(canonicalJson(fields)).digest('hex');
}

/**
 * The identity of what planning reads besides the safetensors files (whose identities the plan
 * records itself): the directory (a file added or removed changes its times), config.json, the
 * index when there is one, the plan file. Taken before planning reads any of them.
 */
export function planInputIdentities(spec: Pick<PlanShapingSpec, 'modelDir' | 'planFile'>): FileIdentity[] {
  const index = join(spec.modelDir, INDEX_FILE);
  // A missing index (a single-file checkpoint) is no input; one added later changes the directory's times.
  return fileIdentities([spec.modelDir, join(spec.modelDir, 'config.json'), ...(existsSync(index) ? [index] : []), ...(spec.planFile ? [spec.planFile] : [])]);
}

/** The plan's field for its records: its key, its inputs' identities, the plan packed. */
export async function packPlan(plan: CheckpointPlan, fields: PlanKeyFields, inputs: readonly FileIdentity[]): Promise<KeptPlan> {
  const json = Buffer.from(JSON.stringify(plan), 'utf8');
  // Quality 5, on the thread pool: 13.7 MB of a 50k-tensor plan packs to 0.6 MB in ~0.12 s.
  const packed = await promisify(brotliCompress)(json, { params: { [constants.BROTLI_PARAM_QUALITY]: 5, [constants.BROTLI_PARAM_SIZE_HINT]: json.length } });
  return {
    format: KEPT_PLAN_FORMAT,
    key: planKey(fields),
    fields,
    inputs: [...inputs, ...plan.files],
    ranks: plan.ranks.map((r) => r.fingerprint),
    bytes: json.length,
    sha256: createHash('sha256').update(json).digest('hex'),
    brotli: packed.toString('base64'),
  };
}

/** Where a model's ranks live on this node: the devices of its local ranks and the first one's global rank. */
export interface LocalRanks {
  devices: readonly string[];
  firstGlobalRank: number;
}

/** A kept plan this start can use, or why not (for the debug line). */
export type KeptPlanFound = { plan: CheckpointPlan; kept: KeptPlan } | { why: string };

/** A record's plan for this start's options, read as far as that needs no device (readKeptPlans). */
interface PlanRead {
  device: string;
  fingerprint: string;
  kept: KeptPlan;
  /** Its files checked and its bytes unpacked: the plan, or why it cannot be used. */
  read: KeptPlanFound;
}

/** What the keeper's records hold for a model's options, by device, before the devices are known (readKeptPlans). */
export interface KeptPlansRead {
  /** The first plan of each device whose key is this start's, in the records' order. */
  plans: PlanRead[];
  /** Why the other records of each device do not serve (for the debug line). */
  others: Array<{ device: string; why: string }>;
}

/**
 * The part of findKeptPlan that needs no device (docs/spec/kept-plan.md §4): every record whose
 * owner has ended is read for a plan kept under `fields`' key (the first of each device), and
 * that plan's files are checked and its bytes unpacked. A restart runs it while the devices are
 * probed (cuInit: ~100 ms on an H100 host), so that what is left once they are known
 * (chooseKeptPlan) is a lookup. `firstGlobalRank`: the model's first local rank's global rank.
 */
export async function readKeptPlans(
  records: readonly ListedRecord[],
  fields: PlanKeyFields,
  firstGlobalRank: number,
  parsePlanField: (record: Buffer) => { plan?: KeptPlan } | { refusal: string },
): Promise<KeptPlansRead> {
  const key = planKey(fields);
  const found: Array<Omit<PlanRead, 'read'>> = [];
  const others: KeptPlansRead['others'] = [];
  for (const r of records) {
    if (r.ownerAlive || found.some((p) => p.device === r.device)) continue;
    const parsed = parsePlanField(r.record);
    if ('refusal' in parsed) {
      others.push({ device: r.device, why: parsed.refusal });
      continue;
    }
    if (parsed.plan === undefined) continue;
    if (parsed.plan.key === key) {
      found.push({ device: r.device, fingerprint: r.fingerprint, kept: parsed.plan });
      continue;
    }
    const differ = differingFields(parsed.plan.fields, fields);
    if (parsed.plan.fields.modelDir === fields.modelDir || differ.length === 0) others.push({ device: r.device, why: `a plan kept for other options (${differ.join(', ') || 'key'} differ)` });
  }
  const plans = await Promise.all(found.map(async (p) => ({ ...p, read: await readPlan(p.kept, p.fingerprint, fields, firstGlobalRank) })));
  return { plans, others };
}

/**
 * Which plan of `read` this start uses, on its devices (`local`), or why none: the rest of
 * findKeptPlan's checks, in its order (the plan is of the first local device's record, every local
 * rank's shard is kept), then what readKeptPlans found reading it.
 */
export function chooseKeptPlan(read: KeptPlansRead, records: readonly ListedRecord[], fields: PlanKeyFields, local: LocalRanks): KeptPlanFound {
  const first = local.devices[0]!;
  const found = read.plans.find((p) => p.device === first);
  if (!found) {
    const others = read.others.filter((o) => o.device === first).map((o) => o.why);
    return { why: `no record of device ${first} carries a plan for these options${others.length ? `: ${others.join('; ')}` : ''}` };
  }
  const early = earlyRefusal(found.kept, found.fingerprint, fields, local.firstGlobalRank);
  if (early) return { why: early };
  for (const [i, device] of local.devices.entries()) {
    const fingerprint = found.kept.ranks[local.firstGlobalRank + i];
    if (!records.some((r) => r.device === device && r.fingerprint === fingerprint && !r.ownerAlive)) {
      return { why: `the shard of local rank ${i} (device ${device}, fingerprint ${fingerprint}) is not kept, so its rank reads the checkpoint anyway` };
    }
  }
  return found.read;
}

/**
 * Finds the plan kept for `fields` among what the keeper holds (its LIST at this start) and
 * checks it (docs/spec/kept-plan.md §4, in that order): readKeptPlans then chooseKeptPlan.
 * `parsePlanField` reads a record's plan field (keptRecord.ts's schema), undefined when it has
 * none or a malformed one.
 */
export async function findKeptPlan(
  records: readonly ListedRecord[],
  fields: PlanKeyFields,
  local: LocalRanks,
  parsePlanField: (record: Buffer) => { plan?: KeptPlan } | { refusal: string },
): Promise<KeptPlanFound> {
  return chooseKeptPlan(await readKeptPlans(records, fields, local.firstGlobalRank, parsePlanField), records, fields, local);
}

/** Why a plan found under the key cannot be this start's, known without reading it: its format, its rank count, or its record's shard. */
function earlyRefusal(kept: KeptPlan, fingerprint: string, fields: PlanKeyFields, firstGlobalRank: number): string | undefined {
  if (kept.format !== KEPT_PLAN_FORMAT) return `the kept plan is in format ${kept.format}, and this weightd reads ${KEPT_PLAN_FORMAT}`;
  if (kept.ranks.length !== fields.tpSize) return `the kept plan names ${kept.ranks.length} ranks, and tp size is ${fields.tpSize}`;
  if (kept.ranks[firstGlobalRank] !== fingerprint) return `the kept plan's rank ${firstGlobalRank} is ${kept.ranks[firstGlobalRank]}, and the shard whose record carries it is ${fingerprint}: not that shard's plan`;
  return undefined;
}

/** A plan found under the key, read: its files' identities checked, its bytes unpacked and parsed (what earlyRefusal refuses is not read). */
async function readPlan(kept: KeptPlan, fingerprint: string, fields: PlanKeyFields, firstGlobalRank: number): Promise<KeptPlanFound> {
  const early = earlyRefusal(kept, fingerprint, fields, firstGlobalRank);
  if (early) return { why: early };
  const changes = await changedFiles(kept.inputs);
  if (changes.length > 0) return { why: `files the plan was made from changed since it was kept (${changes.map(describeChange).join('; ')})` };
  const json = await unpackPlan(kept);
  if (!Buffer.isBuffer(json)) return json;
  let plan: CheckpointPlan;
  try {
    plan = JSON.parse(json.toString('utf8')) as CheckpointPlan;
  } catch {
    return { why: 'the kept plan is not JSON: it is corrupt' };
  }
  const fingerprints = Array.isArray(plan.ranks) ? plan.ranks.map((r) => r?.fingerprint) : [];
  if (plan.tpSize !== fields.tpSize || canonicalJson(fingerprints) !== canonicalJson(kept.ranks)) return { why: "the kept plan's ranks are not the ones its record names: it is corrupt" };
  return { plan, kept };
}

/** The plan's JSON bytes from its field (§3: base64, brotli, then its length and SHA-256 checked), or why they are not the ones kept. */
export async function unpackPlan(kept: Pick<KeptPlan, 'brotli' | 'bytes' | 'sha256'>): Promise<Buffer | { why: string }> {
  let json: Buffer;
  try {
    json = await promisify(brotliDecompress)(Buffer.from(kept.brotli, 'base64'), { maxOutputLength: Math.max(kept.bytes, 1) });
  } catch (err) {
    return { why: `the kept plan does not unpack (${(err as Error).message}): it is corrupt` };
  }
  const sha256 = createHash('sha256').update(json).digest('hex');
  if (json.length !== kept.bytes || sha256 !== kept.sha256) return { why: `the kept plan unpacks to ${json.length} bytes of SHA-256 ${sha256.slice(0, 16)}, and its record says ${kept.bytes} of ${kept.sha256.slice(0, 16)}: it is corrupt` };
  return json;
}

function differingFields(a: PlanKeyFields, b: PlanKeyFields): string[] {
  return (Object.keys(b) as Array<keyof PlanKeyFields>).filter((k) => canonicalJson(a[k] ?? null) !== canonicalJson(b[k] ?? null));
}
