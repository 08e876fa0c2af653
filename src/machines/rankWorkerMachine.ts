// One rank's worker thread as a state machine, in three regions that run side by side:
//
//   rank:       opening -> (admitting ->) adopting -> adopted, or allocating -> filling
//               -> verifying -> exporting -> serving; then releasing -> released (a client's
//               release), or stopping -> stopped (the node stops: the thread ends). A phase that
//               fails frees the device (failing) and reports it once (failed).
//   permission: whether the keeper may have the segments: notYet (a model kept once it serves,
//               RankWorkerData.keepOnceServing) -> allowed -> withdrawn (the model drains: UNKEEP).
//   keeper:     the one keeper call in flight (keeping, dropping) or none (idle). The device is
//               freed only once it is idle, so no descriptor a keep sends is closed under it.
//
// Events can come in any order: an ADMIT before the device is open is remembered (opening.admitted),
// a KEEP before the export is honoured at the export, a KEEP_AGAIN during a keep keeps once more
// after it (keeping.again), an UNKEEP during a keep drops once the keep is done, and anything
// that needs the segments is ignored before they are exported and once they are being freed.
//
// What this machine changed on purpose from the hand-written worker it replaced (issue 32):
// - a RELEASE or STOP during a load drops the phase in progress (its result is ignored, a device
//   it opens late is freed by the open itself); before, the load carried on and the rank posted
//   both FAILED and RELEASED;
// - a KEEP after an UNKEEP no longer keeps: the model is draining;
// - a keep queued (KEEP_AGAIN during a keep) does not run once a RELEASE or STOP came;
// - a RELEASE or STOP during an adopt waits for it (see adopting).
//
// It holds no I/O: the phases (src/actors/rankPhases.ts), the keeper's calls and the thread's port
// are typed placeholders that src/actors/runRankPhases.ts provides, so the chart can be drawn
// and the machine walked (test/machines/rankWorker.paths.test.ts) with no addon loaded.
import { and, assign, fromPromise, not, raise, setup, stateIn } from 'xstate';
import type { Adopted, MainToRank, NotAdopted, RankToMain, RankWorkerData, Resident } from '../models/rankMessages.js';
import { WeightdError, errorCode, serializeError } from '../errors.js';
import type { SegmentExport } from '../native/addon.js';
import type { DeviceHandle, FillResult } from '../native/deviceHandle.js';

export interface RankWorkerInput {
  data: RankWorkerData;
}

export interface RankWorkerContext extends RankWorkerInput {
  device?: DeviceHandle;
  /** Why the keeper's record of this shard was refused (NotAdopted): the fill's source says so. */
  refused?: string;
  resident?: Resident;
  /** The resident segments are the keeper's already (adopted, and their record needs no rewrite: Adopted.rekeep). */
  adopted: boolean;
  /** Once exported: the segments, whose descriptors live until the device is freed. */
  segments?: SegmentExport[];
  /** The currentSince (RankKeeping) of the record the keep in flight sends: its KEPT says which record the keeper holds, or not. */
  keepingSince?: number;
  /** The phase's failure that `failing` reports once the device is freed. */
  failure?: unknown;
}

/** Why the keeper's copies are dropped: the rank's memory is released, or its model was unloaded. */
export type DropReason = 'released' | 'unloaded';

/** What the main thread sends (rankMessages.ts), and EXPORTED, which the rank raises once its segments are out. */
export type RankWorkerEvent = MainToRank | { type: 'EXPORTED' };

function notProvided(name: string): never {
  throw new WeightdError('E_INTERNAL', `the rank worker machine's "${name}" was not provided; create it with .provide() (src/actors/runRankPhases.ts does)`);
}

/** Each phase's type; src/actors/runRankPhases.ts provides them from a RankPhases. */
export const rankWorkerActors = {
  open: fromPromise<DeviceHandle, { data: RankWorkerData }>(() => notProvided('open')),
  adopt: fromPromise<Adopted | NotAdopted | undefined, { device: DeviceHandle; data: RankWorkerData }>(() => notProvided('adopt')),
  allocate: fromPromise<void, { device: DeviceHandle; data: RankWorkerData }>(() => notProvided('allocate')),
  fill: fromPromise<FillResult, { device: DeviceHandle; data: RankWorkerData }>(() => notProvided('fill')),
  verify: fromPromise<void, { data: RankWorkerData }>(() => notProvided('verify')),
  export: fromPromise<SegmentExport[], { device: DeviceHandle; resident: Resident }>(() => notProvided('export')),
  keep: fromPromise<void, { data: RankWorkerData; segments: SegmentExport[]; digests: readonly string[] }>(() => notProvided('keep')),
  dropKept: fromPromise<void, { data: RankWorkerData; reason: DropReason }>(() => notProvided('dropKept')),
  free: fromPromise<void, { device?: DeviceHandle }>(() => notProvided('free')),
};

export const tookKeptShard = (taken: Adopted | NotAdopted | undefined): taken is Adopted => taken !== undefined && 'bytes' in taken;

type Ctx = { context: RankWorkerContext };
const errorMessage = (error: unknown) => (error as Error).message;

const since = (at: number | undefined) => (at !== undefined ? { currentSince: at } : {});
/** The messages the transitions below post, as the `post` action's params. */
const says = {
  kept: ({ context }: Ctx): RankToMain => ({ type: 'KEPT', kept: true, ...since(context.keepingSince) }),
  /** The keeper's record is the one adopted, which carries the currentSince the rank was given. */
  adoptedKept: ({ context }: Ctx): RankToMain => ({ type: 'KEPT', kept: true, ...since(context.data.keeper?.currentSince) }),
  notKept: ({ context, event }: Ctx & { event: { error: unknown } }): RankToMain[] => [
    { type: 'KEPT', kept: false, reason: errorMessage(event.error), ...since(context.keepingSince) },
    {
      type: 'LOG',
      level: 'warn',
      msg: `the keeper did not take this rank's shard (${errorMessage(event.error)}): it will not survive a restart of the daemon`,
      // The keeper's refusal by name (E_KEEPER_FULL: it holds all the records a LIST may carry),
      // also where rankKeeping wrapped it with a hint about an earlier keeper's limit.
      fields: { keeper: context.data.keeper!.socket, code: errorCode(event.error) ?? errorCode((event.error as Error).cause) },
    },
  ],
  dropped: (reason: DropReason) => (): RankToMain => ({ type: 'KEPT', kept: false, reason }),
  notDropped:
    (reason: DropReason) =>
    ({ event }: { event: { error: unknown } }): RankToMain => ({
      type: 'LOG',
      level: 'warn',
      msg: `the keeper did not drop the ${reason} shard (${errorMessage(event.error)}); it frees it when its adoption window ends`,
      fields: {},
    }),
  failed: ({ event }: { event: { error: unknown } }): RankToMain => ({ type: 'FAILED', error: serializeError(event.error) }),
  loadFailed: ({ context }: Ctx): RankToMain => ({ type: 'FAILED', error: serializeError(context.failure) }),
};

const rankWorkerSetup = setup({
  types: {
    context: {} as RankWorkerContext,
    events: {} as RankWorkerEvent,
    input: {} as RankWorkerInput,
  },
  actors: rankWorkerActors,
  guards: {
    awaitsAdmission: ({ context }) => context.data.awaitAdmission === true,
    keepsOnceServing: ({ context }) => context.data.keepOnceServing === true,
    hasKeeper: ({ context }) => context.data.keeper !== undefined,
    adopted: ({ context }) => context.adopted,
    tookKeptShard: (_, output: Adopted | NotAdopted | undefined) => tookKeptShard(output),
    // The segments are out and not being freed.
    serving: stateIn({ rank: 'serving' }),
    admittedEarly: stateIn({ rank: { opening: 'admitted' } }),
    keepAllowed: stateIn({ permission: 'allowed' }),
    keepWithdrawn: stateIn({ permission: 'withdrawn' }),
    keepAgainAsked: stateIn({ keeper: { keeping: 'again' } }),
    keeperIdle: stateIn({ keeper: 'idle' }),
    // A released rank's memory is to be freed: the keeper's copies must go too, unless an UNKEEP
    // dropped them already (by then a version of the same fingerprint, a model loaded again after
    // its files changed, may be kept: keepWithdrawn). They are the exported segments a keep may
    // have handed over, or the shard an adopt took from the keeper.
    dropsOnRelease: ({ context }) => context.data.keeper !== undefined && (context.segments !== undefined || context.resident?.source.from === 'keeper'),
  },
  actions: {
    // What the thread does (src/actors/runRankPhases.ts provides them).
    post: (_, _messages: RankToMain | RankToMain[]) => notProvided('post'),
    /** Cuts a fill in progress short, so that the device can be freed now. */
    cancelFill: (_, _p: { device?: DeviceHandle }) => notProvided('cancelFill'),
    /** Nothing else keeps the thread alive: it ends, and the rank actor sees exit 0. */
    closePort: () => notProvided('closePort'),

    storeDevice: assign({ device: (_, device: DeviceHandle) => device }),
    // The rank's version became current: the records it keeps from now on say when.
    storeCurrentSince: assign(({ context, event }) => {
      const at = event.type === 'KEEP_AGAIN' ? event.currentSince : undefined;
      return at === undefined || !context.data.keeper ? {} : { data: { ...context.data, keeper: { ...context.data.keeper, currentSince: at } } };
    }),
    storeAdopted: assign((_, taken: Adopted | NotAdopted | undefined) => (tookKeptShard(taken) ? { resident: taken, adopted: !taken.rekeep } : {})),
    storeRefused: assign({ refused: (_, taken: NotAdopted | undefined) => (taken && 'refused' in taken ? taken.refused : undefined) }),
    storeFilled: assign({
      resident: ({ context }, filled: FillResult) => ({
        bytes: filled.bytes,
        seconds: filled.seconds,
        digests: filled.digests,
        source: { from: 'checkpoint' as const, ...(context.refused !== undefined ? { refused: context.refused } : {}) },
      }),
    }),
    storeSegments: assign({ segments: (_, segments: SegmentExport[]) => segments }),
    storeKeepingSince: assign({ keepingSince: ({ context }) => context.data.keeper?.currentSince }),
    storeFailure: assign({ failure: (_, error: unknown) => error }),
  },
});

const device = ({ context }: Ctx) => ({ device: context.device! });
const data = ({ context }: Ctx) => ({ data: context.data });
/** Each phase's failure frees the device, then is reported (unless the rank is stopped first). */
const onPhaseError = { target: '#rankWorker.rank.failing', actions: { type: 'storeFailure', params: ({ event }: { event: { error: unknown } }) => event.error } } as const;
/** A release or a stop ends whatever the rank is doing. */
const interrupts = { RELEASE: '#rankWorker.rank.releasing', STOP: '#rankWorker.rank.stopping' } as const;

/** Drops the keeper's copies, then goes on whether or not the keeper did (it frees them when its adoption window ends). */
const dropping = (id: string, reason: DropReason, then: string) => ({
  invoke: {
    id,
    src: 'dropKept',
    input: ({ context }: Ctx) => ({ data: context.data, reason }),
    onDone: { target: then, actions: { type: 'post', params: says.dropped(reason) } },
    onError: { target: then, actions: { type: 'post', params: says.notDropped(reason) } },
  },
}) as const;

export const rankWorkerMachine = rankWorkerSetup.createMachine({
  id: 'rankWorker',
  type: 'parallel',
  context: ({ input }) => ({ ...input, adopted: false }),
  states: {
    rank: {
      initial: 'opening',
      states: {
        opening: {
          initial: 'notAdmitted',
          states: { notAdmitted: { on: { ADMIT: 'admitted' } }, admitted: {} },
          invoke: {
            id: 'open',
            src: 'open',
            input: data,
            onDone: [
              { guard: and(['awaitsAdmission', not('admittedEarly')]), target: 'admitting', actions: { type: 'storeDevice', params: ({ event }) => event.output } },
              { target: 'adopting', actions: { type: 'storeDevice', params: ({ event }) => event.output } },
            ],
            onError: onPhaseError,
          },
          on: interrupts,
        },
        // A model loaded beside others: nothing is allocated until its ranks are known to fit.
        admitting: { on: { ADMIT: 'adopting', ...interrupts } },
        // An adopt is not cut short: between the keeper's take and the device's adopt, a free would
        // run first and the segments it then imports would outlive it. A RELEASE or STOP waits for it
        // (releaseAsked, stopAsked), so that a release also drops the shard it took from the keeper.
        adopting: {
          initial: 'running',
          states: {
            running: { on: { RELEASE: 'releaseAsked', STOP: 'stopAsked' } },
            releaseAsked: { on: { STOP: 'stopAsked' } },
            stopAsked: {},
          },
          invoke: {
            id: 'adopt',
            src: 'adopt',
            input: ({ context }) => ({ device: context.device!, data: context.data }),
            onDone: [
              { guard: stateIn({ rank: { adopting: 'stopAsked' } }), target: '#rankWorker.rank.stopping', actions: { type: 'storeAdopted', params: ({ event }) => event.output } },
              { guard: stateIn({ rank: { adopting: 'releaseAsked' } }), target: '#rankWorker.rank.releasing', actions: { type: 'storeAdopted', params: ({ event }) => event.output } },
              { guard: { type: 'tookKeptShard', params: ({ event }) => event.output }, target: 'verifying', actions: { type: 'storeAdopted', params: ({ event }) => event.output } },
              { target: 'allocating', actions: { type: 'storeRefused', params: ({ event }) => event.output as NotAdopted | undefined } },
            ],
            onError: [
              { guard: stateIn({ rank: { adopting: 'stopAsked' } }), target: '#rankWorker.rank.stopping' },
              { guard: stateIn({ rank: { adopting: 'releaseAsked' } }), target: '#rankWorker.rank.releasing' },
              onPhaseError,
            ],
          },
        },
        allocating: {
          invoke: { id: 'allocate', src: 'allocate', input: ({ context }) => ({ device: context.device!, data: context.data }), onDone: 'filling', onError: onPhaseError },
          on: interrupts,
        },
        filling: {
          invoke: {
            id: 'fill',
            src: 'fill',
            input: ({ context }) => ({ device: context.device!, data: context.data }),
            onDone: { target: 'verifying', actions: { type: 'storeFilled', params: ({ event }) => event.output } },
            onError: onPhaseError,
          },
          on: interrupts,
        },
        // The checkpoint files are still the ones planned: bytes of files that changed meanwhile are never served.
        verifying: {
          invoke: { id: 'verify', src: 'verify', input: data, onDone: 'exporting', onError: onPhaseError },
          on: interrupts,
        },
        exporting: {
          invoke: {
            id: 'export',
            src: 'export',
            input: ({ context }) => ({ ...device({ context }), resident: context.resident! }),
            onDone: { target: 'serving', actions: [{ type: 'storeSegments', params: ({ event }) => event.output }, raise({ type: 'EXPORTED' })] },
            onError: onPhaseError,
          },
          on: interrupts,
        },
        serving: { on: interrupts },
        failing: {
          invoke: {
            id: 'freeAfterFailure',
            src: 'free',
            input: ({ context }) => ({ device: context.device }),
            onDone: { target: 'failed', actions: { type: 'post', params: says.loadFailed } },
            onError: { target: 'failed', actions: { type: 'post', params: says.loadFailed } },
          },
          on: interrupts,
        },
        failed: { on: interrupts },
        releasing: {
          entry: { type: 'cancelFill', params: ({ context }) => ({ device: context.device }) },
          initial: 'settling',
          states: {
            // Until the keeper's call in flight is done.
            settling: {
              always: [
                { guard: and(['keeperIdle', 'dropsOnRelease', not('keepWithdrawn')]), target: 'dropping' },
                { guard: 'keeperIdle', target: 'freeing' },
              ],
            },
            dropping: dropping('dropReleased', 'released', 'freeing'),
            freeing: {
              invoke: {
                id: 'freeToRelease',
                src: 'free',
                input: ({ context }) => ({ device: context.device }),
                onDone: { target: '#rankWorker.rank.released', actions: { type: 'post', params: { type: 'RELEASED' } } },
                onError: { target: '#rankWorker.rank.released', actions: { type: 'post', params: says.failed } },
              },
            },
          },
          on: { STOP: '#rankWorker.rank.stopping' },
        },
        released: { on: { STOP: 'stopping' } },
        stopping: {
          entry: { type: 'cancelFill', params: ({ context }) => ({ device: context.device }) },
          initial: 'settling',
          states: {
            settling: { always: { guard: 'keeperIdle', target: 'freeing' } },
            freeing: {
              invoke: {
                id: 'freeToStop',
                src: 'free',
                input: ({ context }) => ({ device: context.device }),
                onDone: { target: '#rankWorker.rank.stopped', actions: 'closePort' },
                onError: { target: '#rankWorker.rank.stopped', actions: [{ type: 'post', params: says.failed }, 'closePort'] },
              },
            },
          },
        },
        stopped: { type: 'final' },
      },
    },
    permission: {
      initial: 'deciding',
      states: {
        deciding: { always: [{ guard: 'keepsOnceServing', target: 'notYet' }, { target: 'allowed' }] },
        notYet: { on: { KEEP: 'allowed', UNKEEP: 'withdrawn' } },
        allowed: { on: { UNKEEP: 'withdrawn' } },
        // A drained model is never served again.
        withdrawn: {},
      },
    },
    keeper: {
      initial: 'idle',
      states: {
        idle: {
          on: {
            EXPORTED: [{ guard: 'adopted', actions: { type: 'post', params: says.adoptedKept } }, { guard: and(['hasKeeper', 'keepAllowed']), target: 'keeping' }],
            KEEP_AGAIN: [{ guard: and(['hasKeeper', 'serving', 'keepAllowed']), target: 'keeping', actions: 'storeCurrentSince' }, { actions: 'storeCurrentSince' }],
            // KEEP allows keeping from now on (the permission region takes it in the same step).
            KEEP: { guard: and(['hasKeeper', 'serving', not('adopted'), not('keepWithdrawn')]), target: 'keeping' },
            UNKEEP: { guard: 'hasKeeper', target: 'dropping' },
          },
        },
        keeping: {
          // After the transition's storeCurrentSince: the record this keep sends carries it.
          entry: 'storeKeepingSince',
          initial: 'once',
          states: { once: { on: { KEEP_AGAIN: { target: 'again', actions: 'storeCurrentSince' }, KEEP: 'again' } }, again: { on: { KEEP_AGAIN: { actions: 'storeCurrentSince' } } } },
          invoke: {
            id: 'keep',
            src: 'keep',
            input: ({ context }) => ({ data: context.data, segments: context.segments!, digests: context.resident!.digests }),
            onDone: [
              { guard: 'keepWithdrawn', target: 'dropping', actions: { type: 'post', params: says.kept } },
              { guard: and(['keepAgainAsked', 'serving']), target: 'keeping', reenter: true, actions: { type: 'post', params: says.kept } },
              { target: 'idle', actions: { type: 'post', params: says.kept } },
            ],
            onError: [
              { guard: 'keepWithdrawn', target: 'dropping', actions: { type: 'post', params: says.notKept } },
              { guard: and(['keepAgainAsked', 'serving']), target: 'keeping', reenter: true, actions: { type: 'post', params: says.notKept } },
              { target: 'idle', actions: { type: 'post', params: says.notKept } },
            ],
          },
        },
        dropping: dropping('dropUnloaded', 'unloaded', 'idle'),
      },
    },
  },
});
