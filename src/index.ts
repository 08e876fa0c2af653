export { startNode, type NodeModules, type WeightdNode } from './startNode.js';
export type { NodeStatus, NodeResult, NodeState, RankStatus, RankState, PeerStatus, NodeFailure } from './nodeStatus.js';
export { toStatusView, type StatusView, type RankView, type PeerView } from './inspect/statusView.js';
export type { NodeEvent, NodeEventListener } from './inspect/eventFeed.js';
export { machineToChart, chartToMermaid, type MachineChart, type ChartState, type ChartTransition } from './inspect/machineToMermaid.js';
export type { LoadProgress } from './inspect/loadProgress.js';
export type { NodeOptions, DeviceChoice, LogLevel } from './nodeOptions.js';
export { supervisorMachine } from './machines/supervisor.js';
export * from './errors.js';
