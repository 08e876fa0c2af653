// The engine layouts weightd ships, registered in this order by layoutRegistry.ts: one line each.
import type { EngineLayout } from './engineLayout.js';
import { vllmLayout } from './vllmParams.js';

export const BUILTIN_LAYOUTS: readonly EngineLayout[] = [vllmLayout];
