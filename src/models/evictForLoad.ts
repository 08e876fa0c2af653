// Makes room for a load that was refused E_DOES_NOT_FIT, under an eviction policy: asks the policy
// (evictionPolicy.ts) which processed layouts to drop and which models to evict, drops and unloads
// them and resolves once their memory is freed, so that the caller (modelControl.ts) can try the
// load once more. When no choice makes room, nothing is evicted and the load is refused with what
// evicting could have freed.
import { DeviceError, WeightdError } from '../errors.js';
import { planEviction, type EvictionPolicy } from './evictionPolicy.js';
import type { Logger } from '../log.js';
import { formatGiB, type PoolNeed } from './modelFit.js';
import type { EvictedModel, ModelStatus, NodeStatus } from '../nodeStatus.js';

export interface EvictForLoadInput {
  policy: Exclude<EvictionPolicy, 'off'>;
  /** The load's E_DOES_NOT_FIT, whose details name every pool it needs (models/modelMachine.ts). */
  refused: WeightdError;
  /** The name being loaded, for the messages. */
  name: string;
  status: () => NodeStatus;
  /** Unloads the model of this fingerprint (no force: a candidate holds no lease). */
  unload: (fingerprint: string) => void;
  /**
   * Drops processed layout `key` beside rank fingerprint `base` on device `deviceUuid` (no lease
   * holds it); resolves, once its memory is closed, to whether it was dropped (ServerRegistry.dropProcessed).
   */
  dropProcessed: (deviceUuid: string, base: string, key: string) => Promise<boolean>;
  /** Calls `listener` on every change of the node; returns the call that stops it. */
  onChange: (listener: () => void) => () => void;
  log: Logger;
}

/** Whether a version still holds memory: it drains until its ranks are freed (the own model is then released; another is gone). */
function holdsMemory(models: ModelStatus[], v: ModelStatus): boolean {
  return models.some((m) => m.own === v.own && m.fingerprint === v.fingerprint && (m.state === 'serving' || m.state === 'draining'));
}

export async function evictForLoad(input: EvictForLoadInput): Promise<EvictedModel[]> {
  const { refused, name, log } = input;
  const pools = (refused.details.pools ?? []) as PoolNeed[];
  const plan = planEviction(pools, input.status().models);
  if ('refusal' in plan) {
    const r = plan.refusal;
    throw new DeviceError(
      'E_DOES_NOT_FIT',
      `model "${name}" does not fit even if every model with no lease were evicted (--evict ${input.policy}): its ranks need ${r.neededBytes} bytes (${formatGiB(r.neededBytes)}) of ${r.pool}, ` +
        `which has ${r.freeBytes} bytes (${formatGiB(r.freeBytes)}) free and ${r.evictableBytes} bytes (${formatGiB(r.evictableBytes)}) in models with no lease (${r.candidates.join(', ') || 'none'}) and processed layouts no engine maps; ` +
        'nothing was evicted or allocated. Detach the clients of a model and unload it (weightd ctl unload, --force to revoke its leases), or load this one at a smaller share per device',
      { model: name, policy: input.policy, pool: r.pool, neededBytes: r.neededBytes, freeBytes: r.freeBytes, evictableBytes: r.evictableBytes, candidates: r.candidates },
    );
  }
  const evicted: EvictedModel[] = plan.evict.map(({ model: m, bytesByPool }) => ({ name: m.name, fingerprint: m.fingerprint ?? '', own: m.own, bytes: Object.values(bytesByPool).reduce((a, b) => a + b, 0), lastUsedAt: m.lastUsedAt }));
  const victims = plan.evict.map((e) => e.model);
  // Taken out in this turn, as the unloads below: no engine can map one between the choice and the drop.
  const drops = plan.drop.map(({ model: m, deviceUuid, layout }) => {
    log.info({ model: m.name, fingerprint: m.fingerprint, key: layout.key, bytes: layout.bytes, lastMappedAt: layout.lastMappedAt, publishedAt: layout.publishedAt, for: name, policy: input.policy }, `dropping processed layout ${layout.key} of "${m.name}" (no engine maps it; the next start with its key processes again) to make room for "${name}"`);
    return input.dropProcessed(deviceUuid, layout.base, layout.key);
  });
  const freed = new Promise<void>((resolve, reject) => {
    const check = () => {
      const s = input.status();
      if (s.state !== 'ready') {
        stop();
        reject(new WeightdError('E_STOPPED', `the node is ${s.state}: the load of "${name}" stopped while it evicted ${victims.map((v) => v.name).join(', ')}`));
      } else if (!victims.some((v) => holdsMemory(s.models, v))) {
        stop();
        resolve();
      }
    };
    const stop = input.onChange(check);
    // Unloaded in one turn after the plan was made from the status: no client can take a lease
    // on a candidate in between, so each is freed at once rather than drained.
    for (const e of evicted) {
      log.info({ evicted: e.name, fingerprint: e.fingerprint, own: e.own, bytes: e.bytes, lastUsedAt: e.lastUsedAt, for: name, policy: input.policy }, `evicting "${e.name}" (no lease, least recently used) to make room for "${name}"`);
      input.unload(e.fingerprint);
    }
    check();
  });
  await Promise.all([freed, ...drops]);
  return evicted;
}
