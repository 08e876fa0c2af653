// The machines weightd draws from their own definitions (`weightd statechart --machine`, the
// inspect page), by the id each chart carries. Machines only: loading this loads no I/O.
import type { AnyStateMachine } from 'xstate';
import { coordinatorMachine } from './coordinator.js';
import { groupMemberMachine } from './groupMemberMachine.js';
import { modelMachine } from '../models/modelMachine.js';
import { modelRegistryMachine } from '../models/modelRegistryMachine.js';
import { modelGroupMachine } from '../models/modelGroupMachine.js';
import { rankWorkerMachine } from './rankWorkerMachine.js';
import { supervisorMachine } from './supervisor.js';
import { rankServiceMachine } from '../serve/rankServiceMachine.js';
import { machineToChart, type MachineChart } from '../inspect/machineToMermaid.js';
import type { DrawnMachine } from './drawnMachineNames.js';

// A Record over the names: a machine added here without its name, or a name without its machine, does not compile.
const DRAWN_MACHINES: Record<DrawnMachine, AnyStateMachine> = { supervisor: supervisorMachine, coordinator: coordinatorMachine, groupMember: groupMemberMachine, rankService: rankServiceMachine, rankWorker: rankWorkerMachine, modelRegistry: modelRegistryMachine, model: modelMachine, modelGroup: modelGroupMachine };

const charts = new Map<DrawnMachine, MachineChart>();

/** A machine's chart; each is the same for every node, so it is made once. */
export function drawnChart(machine: DrawnMachine): MachineChart {
  let chart = charts.get(machine);
  if (!chart) charts.set(machine, (chart = machineToChart(DRAWN_MACHINES[machine])));
  return chart;
}

/**
 * The machines a node's page draws: the supervisor; on a group the rendezvous coordinator (live
 * on node 0, which runs it); the ranks' serving lifecycle; the model registry, which holds the
 * node's models; the lifecycle of each model the node serves, its first included; and on a group the model group, node 0's all-or-nothing commit of each
 * model that spans the nodes.
 */
export function pageMachinesFor(nnodes: number): DrawnMachine[] {
  const group = nnodes > 1;
  return ['supervisor', ...(group ? (['coordinator', 'groupMember'] as const) : []), 'rankService', 'rankWorker', 'modelRegistry', 'model', ...(group ? (['modelGroup'] as const) : [])];
}
