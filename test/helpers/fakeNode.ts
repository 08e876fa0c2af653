// Fake actors and input for driving the supervisor machine without threads or devices: its model
// actors are real model machines (src/models/modelMachine.ts) whose rank, serve and files-check
// children are these fakes.
import pino from 'pino';
import { fromCallback, fromPromise } from 'xstate';
import { ServerRegistry } from '../../src/serve/serverRegistry.js';
import { WorkerRegistry } from '../../src/models/workerRegistry.js';
import type { RankActorInput, RankCommand } from '../../src/models/rankContract.js';
import type { RankEvent } from '../../src/models/rankContract.js';
import type { GroupSessionInput, PrepareInput, Prepared, PublishCommand, PublishNodeManifestInput, ReportStartupFailureInput } from '../../src/machines/supervisorActors.js';
import type { ServeCommand, ServeEvent, RankServiceInput } from '../../src/serve/serveEvents.js';
import type { NodeConfig } from '../../src/nodeOptions.js';
import type { GroupCommand, GroupEvent } from '../../src/rendezvous/groupEvents.js';
import type { SupervisorInput } from '../../src/machines/supervisor.js';
import type { PlannedModel } from '../../src/models/planModel.js';
import { modelMachine } from '../../src/models/modelMachine.js';
import { modelRegistryMachine } from '../../src/models/modelRegistryMachine.js';
import { FIRST_MODEL_ID, modelActor } from '../../src/models/modelHost.js';
import type { AnyActorRef } from 'xstate';
import type { FileIdentity } from '../../src/files/fileIdentity.js';
import type { DropModelShardsInput } from '../../src/models/dropModelShards.js';

export const LOCAL_RANKS = 2;

export function fakeConfig(over: Partial<NodeConfig> = {}): NodeConfig {
  return {
    models: [{ name: 'model', modelDir: '/fake/model', tpSize: LOCAL_RANKS, layouts: ['checkpoint'] }],
    tpSize: LOCAL_RANKS,
    nnodes: 1,
    nodeRank: 0,
    localWorldSize: LOCAL_RANKS,
    masterAddr: '127.0.0.1',
    weightCachePort: 29999,
    device: 'host',
    cudaHandles: 'ipc',
    fill: {},
    keeper: { mode: 'off', adoptWithinS: 600 },
    rendezvousTimeoutMs: 1000,
    control: false,
    evict: 'off',
    keepVersions: 2,
    processedMaxPercent: 100,
    ...over,
  };
}

export function fakeInput(config: Partial<NodeConfig> = {}): SupervisorInput {
  // The fake rank actors start no thread, so no worker module is ever loaded.
  return { config: fakeConfig(config), log: pino({ level: 'silent' }), rankWorker: new URL('file:///fake/rankWorker.js'), workers: new WorkerRegistry(), servers: new ServerRegistry() };
}

/** The node's first model, as prepareNode plans it: the group's tp size, on this node's ranks. */
export const fakePlanned: PlannedModel = {
  spec: { name: 'model', modelDir: '/fake/model', tpSize: LOCAL_RANKS, layouts: ['checkpoint'] },
  placement: { nodeRank: 0, nnodes: 1, localWorldSize: LOCAL_RANKS },
  plan: {
    modelDir: '/fake/model',
    architecture: 'LlamaForCausalLM',
    tpSize: LOCAL_RANKS,
    fingerprint: 'f'.repeat(64),
    fingerprintFields: {},
    layouts: ['checkpoint'],
    refusedLayouts: {},
    ranks: Array.from({ length: LOCAL_RANKS }, (_, r) => ({
      tpRank: r, tpSize: LOCAL_RANKS, files: [], segments: [256], tensors: [], aliases: {}, ops: [], layouts: {}, zeroRanges: [], totalBytes: 256, fingerprint: `rank${r}`, contentTensors: { names: [], ranges: [] },
    })),
    files: [],
  },
  devices: Array.from({ length: LOCAL_RANKS }, (_, i) => ({ backend: 'host' as const, index: i, uuid: `fake-${i}` })),
  fill: {},
};

export const fakePrepared: Prepared = {
  devices: fakePlanned.devices,
  visibleDevices: LOCAL_RANKS,
  socketDir: '/fake/sockets',
  locks: [],
  models: [fakePlanned],
};

export const fakeRankTable = fakePrepared.devices.map((d, i) => ({
  globalRank: i, nodeRank: 0, localRank: i, hostName: 'fake', deviceUuid: d.uuid,
}));

/** Records what the machine did to its children, so tests can check it at every state. */
export class FakeWorld {
  liveRanks = new Set<number>();
  rankCommands: Array<{ localRank: number; cmd: RankCommand }> = [];
  groupCommands: GroupCommand[] = [];
  groupLive = false;
  liveServers = new Set<number>();
  serveCommands: Array<{ localRank: number; cmd: ServeCommand }> = [];
  manifestLive = false;
  failureReports = 0;
  /** Model actors whose files check runs (a test settles it by sending the child xstate.done.actor.checkFiles). */
  checkingFiles = 0;
  /** What each rank actor and rank service actor was spawned with. */
  rankInputs: RankActorInput[] = [];
  serveInputs: RankServiceInput[] = [];
  /** Models whose kept shards were to be dropped (the model machine's failing). */
  keptDrops = 0;

  implementations() {
    const rank = fromCallback<RankCommand, RankActorInput, RankEvent>(({ input, receive }) => {
      const r = input.workerData.localRank;
      this.rankInputs.push(input);
      this.liveRanks.add(r);
      receive((cmd) => this.rankCommands.push({ localRank: r, cmd }));
      return () => this.liveRanks.delete(r);
    });
    const rankService = fromCallback<ServeCommand, RankServiceInput, ServeEvent>(({ input, receive }) => {
      const r = input.rank.localRank;
      this.serveInputs.push(input);
      this.liveServers.add(r);
      receive((cmd) => this.serveCommands.push({ localRank: r, cmd }));
      return () => this.liveServers.delete(r);
    });
    const checkFiles = fromPromise<void, { files: FileIdentity[] }>(() => {
      this.checkingFiles++;
      return new Promise<void>(() => {});
    });
    const dropModelShards = fromPromise<void, DropModelShardsInput>(() => {
      this.keptDrops++;
      return new Promise<void>(() => {});
    });
    return {
      actors: {
        modelRegistry: modelRegistryMachine.provide({ actors: { model: modelMachine.provide({ actors: { rank, rankService, checkFiles, dropModelShards } }) } }),
        // Never settles by itself: the test sends the done/error events.
        prepareNode: fromPromise<Prepared, PrepareInput>(() => new Promise<Prepared>(() => {})),
        groupSession: fromCallback<GroupCommand, GroupSessionInput, GroupEvent>(({ receive }) => {
          this.groupLive = true;
          receive((cmd) => this.groupCommands.push(cmd));
          return () => (this.groupLive = false);
        }),
        reportStartupFailure: fromPromise<boolean, ReportStartupFailureInput>(() => {
          this.failureReports++;
          return new Promise<boolean>(() => {});
        }),
        publishNodeManifest: fromCallback<PublishCommand, PublishNodeManifestInput>(() => {
          this.manifestLive = true;
          return () => (this.manifestLive = false);
        }),
      },
    };
  }
}

/**
 * Sends a node driven by hand an event where it goes: a rank's to the node's first model's actor
 * (its files check settled once every rank loaded), any other to the supervisor.
 */
export function sendToNode(actor: AnyActorRef, event: { type: string }): void {
  if (!event.type.startsWith('RANK_')) {
    actor.send(event);
    return;
  }
  const model = modelActor(actor.getSnapshot(), FIRST_MODEL_ID)!;
  model.send(event as never);
  if (model.getSnapshot().value === 'verifying') model.send({ type: 'xstate.done.actor.checkFiles' } as never);
}
