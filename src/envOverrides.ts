import { UsageError } from './errors.js';

/**
 * Integer settings read from environment variables (tests shrink deadlines this way): for each
 * key with a variable set, its value, checked to lie in `min`..3600000. `what` names the unit in
 * the error ("whole number of milliseconds").
 */
export function envOverrides<K extends string>(
  defaults: Record<K, number>,
  names: Record<K, string>,
  env: NodeJS.ProcessEnv,
  what = 'whole number',
  min = 1,
): Partial<Record<K, number>> {
  const out: Partial<Record<K, number>> = {};
  for (const key of Object.keys(names) as K[]) {
    const raw = env[names[key]];
    if (raw === undefined || raw === '') continue;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min || n > 3_600_000) {
      throw new UsageError('E_USAGE', `${names[key]}=${JSON.stringify(raw)}: must be a ${what} from ${min} to 3600000; unset it to use ${defaults[key]}`);
    }
    out[key] = n;
  }
  return out;
}
