// What an engine layout is: a second set of names for a rank's arena, the parameters an engine's
// model holds after its weight loaders ran, each made of checkpoint tensors stacked in order
// (docs/sharding.md, Layouts). One file per layout implements it (vllmParams.ts); the planner
// places each parameter's members back to back, so the engine's view of it is one dense block.

/** One engine parameter: its members are checkpoint tensor names, in the order they stack. */
export interface EngineParam {
  name: string;
  members: string[];
  /** > 0: the parameter is [experts, rows / experts, ...] (FusedMoE). */
  experts: number;
}

export interface EngineLayout {
  /** What --layouts, --models files, `weightd ctl load` and a client's `layout` name it by. */
  name: string;
  /** The engine, as the planner's messages name it ("vLLM"). */
  engine: string;
  /**
   * The engine parameters of a checkpoint of `architecture` whose loaded tensors are `names` (tied
   * aliases already removed), in the order of their first member in `names`. Throws a
   * ShardingError when this checkpoint cannot have the layout: the layout alone is then refused,
   * and the rank still serves the others.
   */
  params(architecture: string, names: readonly string[]): EngineParam[];
}
