// What the control socket drives: the node's programmatic API (startNode.ts wires ModelControl
// and the node's status to it). The handlers (handlers/) call it; tests give a fake.
import type { EvictionPolicy } from '../models/evictionPolicy.js';
import type { ModelRequest } from '../models/modelSpecs.js';
import type { LoadResult, ModelStatus, RollbackResult, UnloadResult } from '../nodeStatus.js';

export interface ControlTarget {
  load(request: ModelRequest, options: { evict?: EvictionPolicy }): Promise<LoadResult>;
  unload(target: string, options: { force?: boolean }): UnloadResult | Promise<UnloadResult>;
  models(): ModelStatus[];
  rollback(name: string, version: number): RollbackResult | Promise<RollbackResult>;
}
