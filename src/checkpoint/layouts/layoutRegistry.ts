// The layouts weightd plans: `checkpoint` (the checkpoint's own names and shapes, always served)
// and every engine layout registered here. Each check of a layout name (--layouts, a --models
// file, `weightd ctl load`, a kept record's load request, the planner, a client's get_state) asks
// this registry, so a new engine layout is one file implementing EngineLayout plus one line in
// builtinLayouts.ts.
import { z } from 'zod';
import { BUILTIN_LAYOUTS } from './builtinLayouts.js';
import type { EngineLayout } from './engineLayout.js';

export const CHECKPOINT_LAYOUT = 'checkpoint';

const engines = new Map<string, EngineLayout>();

/** A name a --layouts list can carry: no comma, no space, no case to get wrong. */
const LAYOUT_NAME = /^[a-z][a-z0-9_-]{0,63}$/;

export function registerLayout(layout: EngineLayout): void {
  if (!LAYOUT_NAME.test(layout.name)) {
    throw new RangeError(`layout name ${JSON.stringify(layout.name)} is not 1-64 lower-case letters, digits, "_" and "-" starting with a letter`);
  }
  if (layout.name === CHECKPOINT_LAYOUT || engines.has(layout.name)) throw new RangeError(`layout "${layout.name}" is registered already`);
  engines.set(layout.name, layout);
}

/** `checkpoint` first, then the engine layouts in the order they were registered. */
export function layoutNames(): string[] {
  return [CHECKPOINT_LAYOUT, ...engines.keys()];
}

export function isLayoutName(name: unknown): name is string {
  return name === CHECKPOINT_LAYOUT || (typeof name === 'string' && engines.has(name));
}

/** The engine layout of that name; undefined for `checkpoint` and for a name not registered. */
export function engineLayout(name: string): EngineLayout | undefined {
  return engines.get(name);
}

/** What every refusal of a layout name says: the name and the layouts there are. */
export function unknownLayoutMessage(name: unknown): string {
  return `layout ${JSON.stringify(name)} is not one weightd plans; the layouts are ${layoutNames().join(', ')}`;
}

/** A layout name in a request or a file (checked when parsed, so a layout registered later counts). */
export const KnownLayoutName = z.string().refine(isLayoutName, { error: (issue) => unknownLayoutMessage(issue.input) });

for (const layout of BUILTIN_LAYOUTS) registerLayout(layout);
