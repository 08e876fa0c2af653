// The body of one rank actor's worker thread: it owns one device through the addon for its
// whole life, runs the load's phases (rankPhases.ts) in order, and answers RELEASE, STOP and
// KEEP_AGAIN throughout. The device's memory is freed when this thread frees it or exits, even
// when it is terminated (the addon frees it at environment teardown); what a keeper holds
// outlives it, except after a RELEASE, which drops it there too.
import { parentPort, workerData } from 'node:worker_threads';
import { serializeError } from '../errors.js';
import { formatBytes } from '../inspect/loadProgress.js';
import type { SegmentExport } from '../native/addon.js';
import type { DeviceHandle } from '../native/deviceHandle.js';
import type { MainToRank, RankWorkerData } from '../models/rankMessages.js';
import { rankKeeping, type Post, type RankPhases, type Resident } from './rankPhases.js';

/** Runs this worker thread as a rank with these phases; answers RELEASE, STOP and KEEP_AGAIN throughout. */
export function runRankPhases(phases: RankPhases): void {
  const data = workerData as RankWorkerData;
  const port = parentPort!;
  const post: Post = (m) => port.postMessage(m);
  let device: DeviceHandle | undefined;
  /** The exported segments, once loaded: their descriptors live until the device is freed. */
  let exported: SegmentExport[] | undefined;
  /** The fill's (or the adopted record's) full digests, which the keeper's record carries. */
  let digests: string[] = [];
  /** Set once the supervisor asked this rank to stop: a fill cut short then is not a failure. */
  let stopping = false;
  /** The keeper call in flight: the device is freed only after it, so no descriptor it sends is closed under it. */
  let keeping: Promise<void> = Promise.resolve();
  /** Whether the segments may go to the keeper yet (RankWorkerData.keepOnceServing). */
  let keepAllowed = !data.keepOnceServing;
  /**
   * UNKEEP dropped the keeper's copies already: a RELEASE must not drop again, since by then a
   * version of the same fingerprint (a model loaded again after its files changed) may be kept.
   */
  let unkept = false;
  /** Adopted segments are the keeper's already (taking them made this daemon their owner), unless their record is to be rewritten (Adopted.rekeep). */
  let adopted = false;
  let admit: () => void = () => {};
  const admitted = new Promise<void>((resolve) => (admit = resolve));

  const keep = () => {
    const segments = exported;
    if (!data.keeper || !segments || stopping || !keepAllowed) return;
    keeping = keeping
      .then(() => phases.keep(data, segments, digests))
      .then(
        () => post({ type: 'KEPT', kept: true }),
        (err: unknown) => {
          post({ type: 'KEPT', kept: false, reason: (err as Error).message });
          post({ type: 'LOG', level: 'warn', msg: `the keeper did not take this rank's shard (${(err as Error).message}): it will not survive a restart of the daemon`, fields: { keeper: data.keeper!.socket } });
        },
      );
  };

  /** Drops the keeper's copies of this rank's segments, after any keep in flight. */
  const unkeep = (reason: 'released' | 'unloaded') =>
    (keeping = keeping.then(() =>
      rankKeeping()
        .then(({ dropKept }) => dropKept(data, data.keeper!))
        .then(
          () => post({ type: 'KEPT', kept: false, reason }),
          (err: unknown) => post({ type: 'LOG', level: 'warn', msg: `the keeper did not drop the ${reason} shard (${(err as Error).message}); it frees it when its adoption window ends`, fields: {} }),
        ),
    ));

  port.on('message', async (m: MainToRank) => {
    if (m.type === 'KEEP_AGAIN') {
      keep();
      return;
    }
    if (m.type === 'ADMIT') {
      admit();
      return;
    }
    if (m.type === 'KEEP') {
      keepAllowed = true;
      if (!adopted) keep();
      return;
    }
    if (m.type === 'UNKEEP') {
      keepAllowed = false;
      unkept = true;
      if (data.keeper) unkeep('unloaded');
      return;
    }
    stopping ||= m.type === 'STOP';
    device?.cancelFill();
    try {
      await keeping;
      if (m.type === 'RELEASE' && data.keeper && exported && !unkept) {
        // A released rank's memory is to be freed: the keeper's copies must go too.
        exported = undefined;
        await unkeep('released');
      }
      await device?.free();
      if (m.type === 'RELEASE') post({ type: 'RELEASED' });
    } catch (err) {
      post({ type: 'FAILED', error: serializeError(err) });
    }
    if (m.type === 'STOP') port.close(); // nothing else keeps this thread alive: it ends, and the actor sees exit 0
  });

  const load = async () => {
    const opened = (device = await phases.open(data, post));
    // A STOP meanwhile ends the thread (port.close above) with nothing allocated.
    if (data.awaitAdmission) await admitted;
    const taken = await phases.adopt(opened, data, post);
    const kept = taken && 'bytes' in taken ? taken : undefined;
    adopted = kept !== undefined && !kept.rekeep;
    let resident: Resident | undefined = kept;
    if (!resident) {
      // Its own line: the fill's seconds (the loaded line) do not count making the segments.
      const allocating = performance.now();
      await phases.allocate(opened, data);
      const allocateMs = Math.round(performance.now() - allocating);
      const bytes = data.plan.segments.reduce((a, b) => a + b, 0);
      post({ type: 'LOG', level: 'info', msg: `rank ${data.globalRank} allocated ${formatBytes(bytes)} in ${allocateMs} ms (${data.plan.segments.length} segment${data.plan.segments.length === 1 ? '' : 's'})`, fields: { allocateMs, bytes } });
      resident = { ...(await phases.fill(opened, data, post)), source: { from: 'checkpoint', ...(taken && 'refused' in taken ? { refused: taken.refused } : {}) } };
    }
    await phases.verify(data);
    digests = resident.digests;
    exported = await phases.export(opened, resident, post);
    if (adopted) post({ type: 'KEPT', kept: true });
    else keep();
  };
  load().catch(async (err: unknown) => {
    try {
      await device?.free();
    } finally {
      if (!stopping) post({ type: 'FAILED', error: serializeError(err) });
    }
  });
}
