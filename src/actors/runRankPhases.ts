// The body of one rank actor's worker thread: it owns one device through the addon for its
// whole life, and steps the rank worker machine (src/machines/rankWorkerMachine.ts), which runs
// the load's phases (rankPhases.ts) in order and answers RELEASE, STOP, KEEP, UNKEEP and
// KEEP_AGAIN throughout. The device's memory is freed when this thread frees it or exits, even
// when it is terminated (the addon frees it at environment teardown); what a keeper holds
// outlives it, except after a RELEASE, which drops it there too.
import { parentPort } from 'node:worker_threads';
import { createActor, fromPromise, type ActorSystem, type InputFrom } from 'xstate';
import { serializeError } from '../errors.js';
import { formatBytes } from '../inspect/loadProgress.js';
import { rankWorkerActors, rankWorkerMachine, tookKeptShard } from '../machines/rankWorkerMachine.js';
import { addon } from '../native/addon.js';
import type { MainToRank, RankToMain, RankWorkerData } from '../models/rankMessages.js';
import { rankKeeping, type Post, type RankPhases } from './rankPhases.js';
import { onMainMessage, rankWorkerData } from './rankThread.js';

type InputOf<K extends keyof typeof rankWorkerActors> = InputFrom<(typeof rankWorkerActors)[K]>;
// xstate exports ActorSystem, not its alias AnyActorSystem (any rank's system).
type AnyActorSystem = ActorSystem<any>;

/** One rank's phases, the way it posts to the main thread, and what runs once it stopped. */
interface RankIo {
  phases: RankPhases;
  post: Post;
  stopped: () => void;
}

/**
 * Each started rank's io, by its actor system (one per rank: its machine's and its phases'
 * actors share it). The machine with its implementations is made once (provideRankWorker), and
 * each rank's implementations find their io here: xstate's provide builds a whole new machine,
 * ~0.8 ms of a writer's commit per rank on the development VM (issue 31).
 */
const rankIos = new WeakMap<AnyActorSystem, RankIo>();

function ioOf(system: AnyActorSystem): RankIo {
  const io = rankIos.get(system);
  if (!io) throw new Error('a rank worker machine runs without its phases: start it with startRankMachine');
  return io;
}

/**
 * The machine's phases and keeper calls as a rank's thread runs them (its io: startRankMachine).
 * A phase whose state was left (a RELEASE or STOP) while it ran is aborted (fromPromise's signal):
 * it posts nothing more, and a device it opened, which the machine never stored and so never
 * frees, is freed here.
 */
function rankWorkerImplementations() {
  const unlessAborted =
    (post: Post, signal: AbortSignal): Post =>
    (m) => {
      if (!signal.aborted) post(m);
    };
  return {
    open: fromPromise(async ({ input, signal, system }: { input: InputOf<'open'>; signal: AbortSignal; system: AnyActorSystem }) => {
      const { phases, post } = ioOf(system);
      const device = await phases.open(input.data, unlessAborted(post, signal));
      if (signal.aborted) await device.free();
      return device;
    }),
    adopt: fromPromise(async ({ input, signal, system }: { input: InputOf<'adopt'>; signal: AbortSignal; system: AnyActorSystem }) => {
      const { phases, post } = ioOf(system);
      const taken = await phases.adopt(input.device, input.data, unlessAborted(post, signal));
      // A rank that took its kept shard will not fill: the node's other ranks, which may be
      // waiting for it in their fill group, fill without it. A written version's ranks never
      // fill (they adopt, or fail): their plan's group is its base's, which no fill joins again.
      const group = input.data.fill.group;
      if (group && !input.data.written && tookKeptShard(taken)) addon().leaveFillGroup(input.data.device.backend, group.id, group.size);
      return taken;
    }),
    allocate: fromPromise(async ({ input: { device, data }, system }: { input: InputOf<'allocate'>; system: AnyActorSystem }) => {
      const { phases, post } = ioOf(system);
      // Its own line: the fill's seconds (the loaded line) do not count making the segments.
      const allocating = performance.now();
      await phases.allocate(device, data);
      const allocateMs = Math.round(performance.now() - allocating);
      const bytes = data.plan.segments.reduce((a, b) => a + b, 0);
      const n = data.plan.segments.length;
      post({ type: 'LOG', level: 'info', msg: `rank ${data.globalRank} allocated ${formatBytes(bytes)} in ${allocateMs} ms (${n} segment${n === 1 ? '' : 's'})`, fields: { allocateMs, bytes } });
    }),
    fill: fromPromise(async ({ input, system }: { input: InputOf<'fill'>; system: AnyActorSystem }) => {
      const { phases, post } = ioOf(system);
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
    verify: fromPromise(async ({ input, system }: { input: InputOf<'verify'>; system: AnyActorSystem }) => ioOf(system).phases.verify(input.data)),
    export: fromPromise(async ({ input, system }: { input: InputOf<'export'>; system: AnyActorSystem }) => {
      const { phases, post } = ioOf(system);
      return phases.export(input.device, input.resident, post);
    }),
    keep: fromPromise(async ({ input, system }: { input: InputOf<'keep'>; system: AnyActorSystem }) => {
      const { phases, post } = ioOf(system);
      return phases.keep(input.data, input.segments, input.digests, post);
    }),
    dropKept: fromPromise(async ({ input }: { input: InputOf<'dropKept'> }) => (await rankKeeping()).dropKept(input.data, input.data.keeper!)),
    free: fromPromise(async ({ input }: { input: InputOf<'free'> }) => input.device?.free()),
  };
}

let provided: ReturnType<typeof provideRankWorker> | undefined;

function provideRankWorker() {
  return rankWorkerMachine.provide({
    actors: rankWorkerImplementations(),
    actions: {
      post: ({ system }, messages: RankToMain | RankToMain[]) => {
        const { post } = ioOf(system);
        for (const m of [messages].flat()) post(m);
      },
      cancelFill: (_, { device }) => device?.cancelFill(),
      closePort: ({ system }) => ioOf(system).stopped(),
    },
  });
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
export function startRankMachine(phases: RankPhases, data: RankWorkerData, post: Post, stopped: () => void) {
  provided ??= provideRankWorker();
  const actor = createActor(provided, { input: { data } });
  // Before start: the machine's first actions and phases run from it.
  rankIos.set(actor.system, { phases, post, stopped });
  // A throwing action is a bug in weightd: the rank fails with it rather than hang.
  actor.subscribe({ error: (err) => post({ type: 'FAILED', error: serializeError(err) }) });
  actor.start();
  return { send: (m: MainToRank) => actor.send(m), actor };
}
