// The supervisor's real actors, by the names its setup() declares (its model registry's and models' included), and
// the real rank worker module. Only the composition root (startNode) imports this file: it is what loads the addon,
// the rendezvous and the servers.
import { modelMachine } from '../models/modelMachine.js';
import { modelRegistryMachine } from '../models/modelRegistryMachine.js';
import { checkFiles } from '../models/checkFiles.js';
import { dropModelShardsActor } from '../models/dropModelShards.js';
import { groupSession } from './groupSession.js';
import { prepareNode } from './prepareNode.js';
import { publishNodeManifest } from './publishNodeManifest.js';
import { rankActor } from './rankActor.js';
import { reportStartupFailureActor } from './reportStartupFailure.js';
import { rankServiceActor } from './rankServiceActor.js';

export { rankWorkerModule, warmRankWorkerModule } from './rankWorkerModules.js';

export const nodeActors = {
  prepareNode,
  groupSession,
  publishNodeManifest,
  reportStartupFailure: reportStartupFailureActor,
  modelRegistry: modelRegistryMachine.provide({ actors: { model: modelMachine.provide({ actors: { rank: rankActor, rankService: rankServiceActor, checkFiles, dropModelShards: dropModelShardsActor } }) } }),
};
