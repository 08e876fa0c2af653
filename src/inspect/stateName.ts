import type { StateValue } from 'xstate';

/** A state value as one string: "loading", or "a.b" for nested states, "a.b,c.d" for parallel ones. */
export function stateName(value: StateValue): string {
  const paths = (v: StateValue | undefined): string[] =>
    typeof v === 'string' ? [v] : Object.entries(v ?? {}).flatMap(([k, sub]) => {
      const below = paths(sub);
      return below.length === 0 ? [k] : below.map((p) => `${k}.${p}`);
    });
  return paths(value).join(',');
}
