// A rank's side of the keeper, run on the rank's worker thread, which owns the device and its
// descriptors: adopt the segments a keeper holds for this rank instead of loading them, hand the
// keeper the segments this rank loaded, and drop them when a client releases the rank. Every
// keeper failure here degrades to a load from disk or to a rank that is not kept, and says so:
// the keeper makes restarts fast, it never stops a node from serving.
import { canonicalJson } from '../checkpoint/canonicalJson.js';
import type { Adopted, NotAdopted, Post, RankKeeping, RankWorkerData } from '../models/rankMessages.js';
import { errorCode } from '../errors.js';
import { addon, type SegmentExport } from '../native/addon.js';
import type { DeviceHandle } from '../native/deviceHandle.js';
import { KeeperClient } from '../keeper/keeperClient.js';
import { checkKeptRecord, encodeKeptRecord, keptRecordFor, WRITTEN_FORMAT, type KeptExpectation, type KeptHandleType } from '../keeper/keptRecord.js';
import { KEEPER_MAX_REQUEST_BYTES, KEEPER_V1_MAX_REQUEST_BYTES, keepPayloadBytes } from '../keeper/keeperProtocol.js';

const why = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** The handle type this rank's device will export, or undefined for legacy CUDA IPC handles. */
export function handleTypeFor(data: RankWorkerData): KeptHandleType | undefined {
  if (data.device.backend === 'host') return 'memfd';
  return data.cudaHandles === 'fd' ? 'cuda-fd' : undefined;
}

function expectation(data: RankWorkerData, handleType: KeptHandleType): KeptExpectation {
  return { backend: data.device.backend, handleType, device: data.device.uuid, plan: data.plan, files: data.files };
}

/**
 * Takes this rank's kept segments and adopts them into `device`. Undefined (after a log line
 * saying why) when there is nothing to adopt, NotAdopted when its record was refused: the rank
 * then loads from the checkpoint.
 */
export async function adoptKept(device: DeviceHandle, data: RankWorkerData, keeping: RankKeeping, handleType: KeptHandleType | undefined, post: Post): Promise<Adopted | NotAdopted | undefined> {
  const log = (level: 'info' | 'warn', msg: string, fields: Record<string, unknown> = {}) => post({ type: 'LOG', level, msg, fields: { keeper: keeping.socket, ...fields } });
  if (handleType === undefined) {
    log('warn', 'this device serves legacy CUDA IPC handles, which no keeper can hold: loading from the checkpoint (run with --cuda-handles fd to keep the shard)');
    return undefined;
  }
  const keeper = new KeeperClient(keeping.socket);
  const started = performance.now();
  const uuid = data.device.uuid;
  const fingerprint = data.plan.fingerprint;
  let taken;
  try {
    taken = await keeper.take(uuid, fingerprint);
  } catch (err) {
    // Not kept is the common answer (a first start, a model new to this node); what the keeper
    // held for this device under other fingerprints was dropped before any rank loaded
    // (dropUnplanned.ts), so the load has the memory.
    if (errorCode(err) !== 'E_NOT_KEPT') log('warn', `the keeper did not answer (${why(err)}): loading from the checkpoint`);
    return undefined;
  }
  const checked = checkKeptRecord(taken.record, expectation(data, handleType));
  if ('refusal' in checked) {
    for (const fd of taken.fds) addon().closeFd(fd);
    await keeper.drop(uuid, fingerprint).catch(() => 0);
    log('warn', `refused the kept shard: ${checked.refusal.message}; dropped it, loading from the checkpoint`, { field: checked.refusal.field, ...(checked.refusal.changes ? { changes: checked.refusal.changes } : {}) });
    return { refused: checked.refusal.message };
  }
  try {
    await device.adopt(taken.fds, data.plan.segments, data.written?.segmentMemory);
  } catch (err) {
    // adopt() closed the descriptors; the keeper's copy is as unusable as ours.
    await keeper.drop(uuid, fingerprint).catch(() => 0);
    log('warn', `could not adopt the kept shard (${why(err)}); dropped it, loading from the checkpoint`);
    return undefined;
  }
  const seconds = (performance.now() - started) / 1000;
  // Key order differs between a parsed record and one built here. A record without this start's
  // plan (kept by a weightd before plans were kept, or one this start refused) is kept again with
  // it, so that the next restart plans from it.
  const rekeep = canonicalJson(checked.record.load ?? null) !== canonicalJson(keeping.load ?? null) || (keeping.plan !== undefined && canonicalJson(checked.record.plan ?? null) !== canonicalJson(keeping.plan));
  // A record without digests (an older daemon's) is adopted: the rank serves without full
  // digests until its next fill from the checkpoint, and says so.
  const digests = checked.record.written?.digests ?? checked.record.digests ?? [];
  if (digests.length === 0) log('info', 'the kept shard carries no full-content digests (an older weightd kept it): serving without them until the next load from the checkpoint');
  return { bytes: data.plan.totalBytes, seconds, source: { from: 'keeper', keptAt: checked.record.keptAt, ageMs: taken.ageMs, thread: 'worker' }, rekeep, digests };
}

/**
 * Whether the keeper holds a shard this rank would adopt (a record of its device and fingerprint,
 * of no live owner, that its checks accept), without taking it. False on any doubt: the rank is
 * then judged as one that allocates.
 */
export async function keptShardAdoptable(data: RankWorkerData, keeping: RankKeeping): Promise<boolean> {
  const handleType = handleTypeFor(data);
  if (handleType === undefined) return false;
  let records;
  try {
    records = await new KeeperClient(keeping.socket).list();
  } catch {
    return false;
  }
  const kept = records.find((r) => r.device === data.device.uuid && r.fingerprint === data.plan.fingerprint && !r.ownerAlive);
  return kept !== undefined && 'record' in checkKeptRecord(kept.record, expectation(data, handleType));
}

/** The shards whose plan was left out for an earlier keeper's limit, in this thread: said once each. */
const planLeftOut = new Set<string>();

/**
 * Hands the keeper this rank's segments (it keeps its own copies of the descriptors). `post`
 * logs, on the rank's thread.
 */
export async function keepSegments(data: RankWorkerData, keeping: RankKeeping, segments: SegmentExport[], digests: readonly string[], post: Post): Promise<void> {
  const handleType = handleTypeFor(data);
  if (handleType === undefined || segments.some((s) => s.fd === undefined || s.fd < 0)) {
    throw new Error('this device serves legacy CUDA IPC handles, which no keeper can hold (run with --cuda-handles fd)');
  }
  const { uuid } = data.device;
  const { fingerprint } = data.plan;
  // A written version's digests are its record's written part's (its own tensors', not a checkpoint's).
  const written = keeping.written && data.written && { format: WRITTEN_FORMAT, ...keeping.written, digests: [...digests], shared: data.written.shared };
  const recordWith = (plan: typeof keeping.plan) =>
    encodeKeptRecord(keptRecordFor(expectation(data, handleType), keeping.model, keeping.writer, keeping.load, written ? [] : digests, plan, undefined, { written, currentSince: keeping.currentSince }));
  const bytes = (record: Buffer) => keepPayloadBytes(uuid, fingerprint, record);
  let record = recordWith(keeping.plan);
  // The shard matters more than its plan: a record the plan would push past a KEEP frame's limit
  // is kept without it (the next restart plans from the headers; docs/spec/kept-plan.md §3).
  let withPlan = keeping.plan !== undefined;
  if (withPlan && bytes(record) > KEEPER_MAX_REQUEST_BYTES) {
    record = recordWith(undefined);
    withPlan = false;
  }
  const fds = [...segments].sort((a, b) => a.segment - b.segment).map((s) => s.fd!);
  const keeper = new KeeperClient(keeping.socket);
  const planLeftOutFor = (reason: string, withoutPlan: number, withPlanBytes: number) => {
    const key = `${uuid}\u0000${fingerprint}`;
    if (planLeftOut.has(key)) return;
    planLeftOut.add(key);
    post({
      type: 'LOG',
      level: 'warn',
      msg: `the keeper did not take this rank's record with the model's plan (${reason}; ${withPlanBytes} bytes, and a keeper of an earlier weightd build takes at most ${KEEPER_V1_MAX_REQUEST_BYTES}): kept the shard without the plan, so the next start plans from the checkpoint's headers; stop that keeper (weightd keeper stop, which frees what it holds) so that a start with --keeper spawn runs this build's, to keep the plan too`,
      fields: { keeper: keeping.socket, bytes: withPlanBytes, withoutPlan },
    });
  };
  // A keeper already found to be of an earlier build is not sent what it refuses again.
  if (withPlan && bytes(record) > KEEPER_V1_MAX_REQUEST_BYTES && (await isEarlierKeeper(keeper, keeping))) {
    const without = recordWith(undefined);
    if (bytes(without) <= KEEPER_V1_MAX_REQUEST_BYTES) {
      planLeftOutFor("it refused a record past its limit earlier in this daemon's life, as a keeper of an earlier build does", bytes(without), bytes(record));
      record = without;
      withPlan = false;
    }
  }
  try {
    await keeper.keep(uuid, fingerprint, record, fds);
    return;
  } catch (err) {
    // A keeper outlives daemon upgrades (docs/operations.md): one of an earlier build refuses a
    // request past 1 MiB on its header (docs/spec/keeper-wire.md §1, §5), and the sender most
    // often sees only its broken pipe, so the size says it, not the error.
    if (bytes(record) <= KEEPER_V1_MAX_REQUEST_BYTES) throw err;
    // A keeper of this build that refuses by name has read the request: its refusal stands
    // (E_KEEPER_FULL would refuse the record without the plan as well, or take it over another).
    if (errorCode(err) === 'E_KEEPER_FULL') throw err;
    const without = withPlan ? recordWith(undefined) : undefined;
    if (without === undefined || bytes(without) > KEEPER_V1_MAX_REQUEST_BYTES) throw pastEarlierLimit(err, bytes(record));
    await keeper.keep(uuid, fingerprint, without, fds);
    await rememberEarlierKeeper(keeper, keeping);
    planLeftOutFor(why(err), bytes(without), bytes(record));
  }
}

/**
 * Whether the keeper at `keeper` is the one this daemon found to be of an earlier build
 * (RankKeeping.earlierKeeper): by its pid, which a PING asks only once one was found, so that
 * a keeper of this build that replaced it (a --keeper spawn start) is sent the plan again.
 */
async function isEarlierKeeper(keeper: KeeperClient, keeping: RankKeeping): Promise<boolean> {
  const pid = keeping.earlierKeeper && Atomics.load(keeping.earlierKeeper, 0);
  if (!pid) return false;
  const now = await keeper.ping().then(
    (p) => p.pid,
    () => 0,
  );
  if (now === pid) return true;
  if (now !== 0) Atomics.compareExchange(keeping.earlierKeeper!, 0, pid, 0);
  return false;
}

/** The keeper took the record without the plan that it refused: every rank's thread sends it so from now on (isEarlierKeeper). */
async function rememberEarlierKeeper(keeper: KeeperClient, keeping: RankKeeping): Promise<void> {
  if (!keeping.earlierKeeper) return;
  const pid = await keeper.ping().then(
    (p) => p.pid,
    () => 0,
  );
  if (pid !== 0) Atomics.store(keeping.earlierKeeper, 0, pid);
}

/** A KEEP past an earlier keeper's limit failed: the error says so, with the size and what to do. */
function pastEarlierLimit(err: unknown, bytes: number): Error {
  return new Error(`${why(err)}; the record is ${bytes} bytes, and a keeper of an earlier weightd build takes at most ${KEEPER_V1_MAX_REQUEST_BYTES}: to keep it, stop that keeper (weightd keeper stop, which frees what it holds) so that a start with --keeper spawn runs this build's`, { cause: err });
}

/** Drops this rank's kept segments (a client released the rank: its memory is to be freed). */
export async function dropKept(data: RankWorkerData, keeping: RankKeeping): Promise<void> {
  await new KeeperClient(keeping.socket).drop(data.device.uuid, data.plan.fingerprint);
}
