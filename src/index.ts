export { startNode, type WeightdNode, type NodeStatus, type NodeResult, type NodeState } from './startNode.js';
export type { NodeOptions, DeviceChoice, LogLevel } from './nodeOptions.js';
export { supervisorMachine } from './machines/supervisor.js';
export * from './errors.js';
