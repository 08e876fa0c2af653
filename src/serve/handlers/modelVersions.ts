// How a request finds the model version it is about, and how replies list the versions on a socket.
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import type { ModelRef } from '../../wire/protocol.js';
import type { RankService } from '../rankService.js';

/** Every version on the socket, as replies list them. */
export function modelRefs(services: DeviceServices): ModelRef[] {
  return services.all.map((s) => modelRef(s, services));
}

/** `current`: the version of its name that clients are pointed to now (retained ones serve too). */
export function modelRef(s: RankService, services: DeviceServices): ModelRef {
  const current = services.newestServing(s.name) === s;
  return { name: s.name, fingerprint: s.rank.fingerprint, status: s.status, globalRank: s.rank.globalRank, tpSize: s.rank.tpSize, version: s.rank.version ?? 0, current };
}

/**
 * The version a command that may name one by fingerprint is about (versionOf in protocol.ts).
 * Throws E_UNKNOWN_MODEL naming what the socket serves when there is none.
 */
export function versionFor(services: DeviceServices, fingerprint: string | undefined): RankService {
  const found = fingerprint === undefined ? services.fallback() : services.byFingerprint(fingerprint);
  if (found) return found;
  const served = services.all.map((s) => `${s.name} (${s.rank.fingerprint.slice(0, 12)}…)`);
  throw new ServeError(
    'E_UNKNOWN_MODEL',
    fingerprint === undefined
      ? 'no model is served on this device any more; load the weights from disk'
      : `no model version with fingerprint ${fingerprint.slice(0, 64)} is served on this device; it serves ${served.join(', ') || 'nothing'}`,
    { models: modelRefs(services) },
  );
}
