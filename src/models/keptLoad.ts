// The load request that the kept record of a model loaded at run time carries (keptRecord.ts's
// `load`), apart from the record's schema: the supervisor makes one for every such model, and a
// plain start loads no schema it does not use (test/cli/startupModules.test.ts).
import type { ModelSpec } from './modelSpecs.js';
import type { KeptLoad } from '../keeper/keptRecord.js';

/** The load request of a model loaded at run time, as its records carry it. */
export function keptLoadOf(spec: ModelSpec, fingerprint: string): KeptLoad {
  return { name: spec.name, modelDir: spec.modelDir, tpSize: spec.tpSize, ...(spec.planFile === undefined ? {} : { planFile: spec.planFile }), layouts: spec.layouts, fingerprint };
}
