import type { Logger } from '../log.js';
import type { DeviceLock } from '../wire/deviceLock.js';
import { DeviceServer, type RankServiceStats } from './deviceServer.js';
import type { RankService } from './rankService.js';
import { FilesCheck } from './filesCheck.js';
import { serveLimits, type ServeLimits } from './serveLimits.js';
import { UpdateDesk } from './updateDesk.js';
import { PublishDesk } from './publishDesk.js';
import { PullPlanDesk } from './pullPlanDesk.js';
import type { UpdateHost } from './deviceServices.js';

export interface ServeOptions {
  /**
   * The model version the service is a rank of (its model actor's id).
   * Counters go by it and the rank fingerprint together: a checkpoint released and loaded again
   * is two versions of one fingerprint, each with its own leases.
   */
  version: string;
  socketDir?: string;
  log: Logger;
  limits?: Partial<ServeLimits>;
}

/**
 * The node's device sockets: one DeviceServer per device, bound when the first model version on
 * the device serves and closed when the last is withdrawn, so that every model on a device shares
 * its one socket. Status and metrics read each version's counters here (by its version and rank
 * fingerprint) without the machines holding server objects in their context.
 */
export class ServerRegistry {
  /** The node's first model's name (config.models[0].name): its first version is listed first on each socket (DeviceServer.add). */
  readonly #defaultModel: string | undefined;
  readonly #servers = new Map<string, { server: DeviceServer; listening: Promise<string> }>();
  /** Device locks the node took before loading (prepareNode): a device's server takes over its lock. */
  readonly #locks = new Map<string, DeviceLock>();
  readonly #byVersion = new Map<string, { service: RankService; server: DeviceServer }>();
  /** Which version of its model each service is a rank of, for withdraw. */
  readonly #versionOf = new Map<RankService, string>();
  /** Each served version's file check, shared by its ranks on every device (FilesCheck). */
  readonly #filesChecks = new Map<string, FilesCheck>();
  /** Writers' updates of every model on the node's sockets; the node sets its publisher. */
  readonly updates = new UpdateDesk();
  readonly #updateHost: UpdateHost = {
    desk: this.updates,
    publishes: new PublishDesk(),
    plans: new PullPlanDesk(),
    versionOf: (service) => {
      const version = this.#versionOf.get(service);
      if (version === undefined) return undefined;
      const ranks = [...this.#versionOf].filter(([, v]) => v === version).map(([s]) => s.rank.globalRank);
      return { version, ranks: ranks.sort((a, b) => a - b) };
    },
  };

  /** `processedMaxPercent`: --processed-max-percent (PublishDesk). */
  constructor(options: { defaultModel?: string; processedMaxPercent?: number } = {}) {
    this.#defaultModel = options.defaultModel;
    this.#updateHost.publishes = new PublishDesk(options.processedMaxPercent);
  }

  /** Keeps a lock taken before loading, for the device's server when it binds. */
  holdLock(lock: DeviceLock): void {
    this.#locks.set(lock.uuid, lock);
  }

  /**
   * Serves `service` on its device's socket, binding it first when no version serves there yet.
   * Resolves to the socket's path; rejects when binding failed (the service is then withdrawn).
   */
  async serve(service: RankService, options: ServeOptions): Promise<string> {
    const uuid = service.rank.device.uuid;
    let check = this.#filesChecks.get(options.version);
    if (!check) {
      check = new FilesCheck(service.rank.files, serveLimits(options.limits).filesCheckMs);
      this.#filesChecks.set(options.version, check);
    }
    service.watchFiles(check);
    let entry = this.#servers.get(uuid);
    if (!entry) {
      const server = new DeviceServer({ deviceUuid: uuid, socketDir: options.socketDir, log: options.log, lock: this.#locks.get(uuid), limits: options.limits, defaultModel: this.#defaultModel, updates: this.#updateHost });
      this.#locks.delete(uuid);
      entry = { server, listening: server.listen() };
      this.#servers.set(uuid, entry);
    }
    entry.server.add(service);
    this.#byVersion.set(versionKey(options.version, service.rank.fingerprint), { service, server: entry.server });
    this.#versionOf.set(service, options.version);
    try {
      return await entry.listening;
    } catch (err) {
      this.withdraw(service);
      throw err;
    }
  }

  /** Stops serving `service`; the device's socket closes (and its lock goes) with its last version. Idempotent. */
  withdraw(service: RankService): void {
    const uuid = service.rank.device.uuid;
    const entry = this.#servers.get(uuid);
    const version = this.#versionOf.get(service);
    this.#versionOf.delete(service);
    service.unwatchFiles();
    // Its published layouts go with it (a release closed them already; a shutdown does not
    // release), once no get_processed reply is still sending their descriptors.
    service.closeProcessed();
    if (version !== undefined) {
      const key = versionKey(version, service.rank.fingerprint);
      if (this.#byVersion.get(key)?.service === service) this.#byVersion.delete(key);
      if (![...this.#versionOf.values()].includes(version)) this.#filesChecks.delete(version);
    }
    if (!entry || entry.server.remove(service) > 0) return;
    this.#servers.delete(uuid);
    entry.server.close();
  }

  /** Makes `service` the newest version of its name on its device's socket (DeviceServer.promote). */
  promote(service: RankService): void {
    this.#servers.get(service.rank.device.uuid)?.server.promote(service);
  }

  /**
   * Drops the processed layout `key` served beside rank fingerprint `base` on device `deviceUuid`,
   * to make room for a load (src/models/evictionPolicy.ts); only one no lease holds
   * (RankService.dropProcessed). Resolves to whether one was dropped.
   */
  async dropProcessed(deviceUuid: string, base: string, key: string): Promise<boolean> {
    const service = [...this.#versionOf.keys()].find((s) => s.rank.device.uuid === deviceUuid && s.rank.fingerprint === base && s.processed.get(key) !== undefined);
    return service ? service.dropProcessed(key) : false;
  }

  /** A version's rank's counters, or undefined while it has no server. */
  stats(version: string, fingerprint: string): RankServiceStats | undefined {
    const entry = this.#byVersion.get(versionKey(version, fingerprint));
    return entry && entry.server.stats(entry.service);
  }
}

const versionKey = (version: string, fingerprint: string) => `${version}/${fingerprint}`;
