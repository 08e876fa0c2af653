// The body of one rank actor's worker thread: it owns one device through the addon for its
// whole life, and steps the rank worker machine (src/machines/rankWorkerMachine.ts), which runs
// the load's phases (rankPhases.ts) in order and answers RELEASE, STOP, KEEP, UNKEEP and
// KEEP_AGAIN throughout. The device's memory is freed when this thread frees it or exits, even
// when it is terminated (the addon frees it at environment teardown); what a keeper holds
// outlives it, except after a RELEASE, which drops it there too.
import { parentPort } from 'node:worker_threads';
import { createActor, fromPromise, type InputFrom } from 'xstate';
import { serializeError } from '../errors.js';
import { formatBytes } from '../inspect/loadProgress.js';
import { rankWorkerActors, rankWorkerMachine, tookKeptShard } from '../machines/rankWorkerMachine.js';
import { addon } from '../native/addon.js';
import type { MainToRank, RankToMain, RankWorkerData } from '../models/rankMessages.js';
import { rankKeeping, type Post, type RankPhases } from './rankPhases.js';
import { onMainMessage, rankWorkerData } from './rankThread.js';

type InputOf<K extends keyof typeof rankWorkerActors> = InputFrom<(typeof rankWorkerActors)[K]>;

/**
 * The machine's phases and keeper calls as this thread runs them. A phase whose state was left
 * (a RELEASE or STOP) while it ran is aborted (fromPromise's signal): it posts nothing more, and a
 * device it opened, which the machine never stored and so never frees, is freed here.
 */
export function rankWorkerImplementations(phases: RankPhases, post: Post) {
  const unlessAborted =
    (signal: AbortSignal): Post =>
    (m) => {
      if (!signal.aborted) post(m);
    };
  return {
    open: fromPromise(async ({ input, signal }: { input: InputOf<'open'>; signal: AbortSignal }) => {
      const device = await phases.open(input.data, unlessAborted(signal));
      if (signal.aborted) await device.free();
      return device;
    }),
    adopt: fromPromise(async ({ input, signal }: { input: InputOf<'adopt'>; signal: AbortSignal }) => {
      const taken = await phases.adopt(input.device, input.data, unlessAborted(signal));
      // A rank that took its kept shard will not fill: the node's other ranks, which may be
      // waiting for it in their fill group, fill without it. A written version's ranks never
      // fill (they adopt, or fail): their plan's group is its base's, which no fill joins again.
      const group = input.data.fill.group;
      if (group && !input.data.written && tookKeptShard(taken)) addon().leaveFillGroup(input.data.device.backend, group.id, group.size);
      return taken;
    }),
    allocate: fromPromise(async ({ input: { device, data } }: { input: InputOf<'allocate'> }) => {
      // Its own line: the fill's seconds (the loaded line) do not count making the segments.
      const allocating = performance.now();
      await phases.allocate(device, data);
      const allocateMs = Math.round(performance.now() - allocating);
      const bytes = data.plan.segments.reduce((a, b) => a + b, 0);
      const n = data.plan.segments.length;
      post({ type: 'LOG', level: 'info', msg: `rank ${data.globalRank} allocated ${formatBytes(bytes)} in ${allocateMs} ms (${n} segment${n === 1 ? '' : 's'})`, fields: { allocateMs, bytes } });
    }),
    fill: fromPromise(async ({ input }: { input: InputOf<'fill'> }) => {
      // The keeper's side, which keeps the shard once filled, loads while the fill runs on the
      // addon's threads, not on the way to it (warmRankWorker.ts).
      if (input.data.keeper) void rankKeeping().catch(() => {});
      const filled = await phases.fill(input.device, input.data, post);
      // GPU hashing is the default on cuda; where it could not run, the fill was slower: say why.
      const why = filled.digestGpuUnavailable;
      if (why) post({ type: 'LOG', level: 'info', msg: `rank ${input.data.globalRank} hashed its content digests on the CPU: ${why}`, fields: { digestGpuUnavailable: why } });
      // What the fill spent before its first read making its pinned staging (native/pinned_stash.h).
      if (filled.stagingSeconds !== undefined) {
        const stagingMs = Math.round(filled.stagingSeconds * 1e4) / 10;
        const how = filled.stagingPinnedAhead ? 'the CUDA warm-up had pinned it' : 'pinned by the fill';
        post({ type: 'LOG', level: 'info', msg: `rank ${input.data.globalRank} made its fill's staging in ${stagingMs} ms (${how})`, fields: { stagingMs, stagingPinnedAhead: filled.stagingPinnedAhead } });
      }
      return filled;
    }),
    verify: fromPromise(async ({ input }: { input: InputOf<'verify'> }) => phases.verify(input.data)),
    export: fromPromise(async ({ input }: { input: InputOf<'export'> }) => phases.export(input.device, input.resident, post)),
    keep: fromPromise(async ({ input }: { input: InputOf<'keep'> }) => phases.keep(input.data, input.segments, input.digests, post)),
    dropKept: fromPromise(async ({ input }: { input: InputOf<'dropKept'> }) => (await rankKeeping()).dropKept(input.data, input.data.keeper!)),
    free: fromPromise(async ({ input }: { input: InputOf<'free'> }) => input.device?.free()),
  };
}

/** Runs this worker thread as a rank with these phases; answers RELEASE, STOP, KEEP, UNKEEP and KEEP_AGAIN throughout. */
export function runRankPhases(phases: RankPhases): void {
  const port = parentPort!;
  const rank = startRankMachine(phases, rankWorkerData(), (m) => port.postMessage(m), () => port.close());
  onMainMessage((m) => rank.send(m));
}

/**
 * Steps the rank worker machine with these phases on the calling thread: a worker thread's
 * (runRankPhases), or the main thread's for a rank that adopts its kept shard with no worker
 * (src/actors/adoptHere.ts). `stopped` runs once the rank stopped and freed its device.
 */
export function startRankMachine(phases: RankPhases, data: RankWorkerData, post: Post, stopped: () => void): { send(m: MainToRank): void } {
  const actor = createActor(
    rankWorkerMachine.provide({
      actors: rankWorkerImplementations(phases, post),
      actions: {
        post: (_, messages: RankToMain | RankToMain[]) => {
          for (const m of [messages].flat()) post(m);
        },
        cancelFill: (_, { device }) => device?.cancelFill(),
        closePort: stopped,
      },
    }),
    { input: { data } },
  );
  // A throwing action is a bug in weightd: the rank fails with it rather than hang.
  actor.subscribe({ error: (err) => post({ type: 'FAILED', error: serializeError(err) }) });
  actor.start();
  return { send: (m) => actor.send(m) };
}
