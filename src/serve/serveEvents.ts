// The contract of the serve actor (src/actors/rankServiceActor.ts): its input, and the events between it
// and the machines that spawn it (the model machine, the supervisor).
import type { SerializedError } from '../errors.js';
import type { IdentityChange } from '../files/fileIdentity.js';
import type { Logger } from '../log.js';
import type { ServedRankData } from './servedRankData.js';
import type { ServeLimits } from './serveLimits.js';
import type { ServerRegistry } from './serverRegistry.js';

/** From a serve actor to the supervisor. */
export type ServeEvent =
  /** The socket is bound and accepting; clients may attach. */
  | { type: 'RANK_SERVING'; localRank: number; socketPath: string }
  /** A client's release was allowed: free the rank's memory, then send SERVE_RELEASED. */
  | { type: 'RANK_RELEASE_REQUESTED'; localRank: number }
  /** Its checkpoint files changed since it was planned (filesCheck.ts): it refuses new leases (E_STALE), to be drained and reloaded. `described`: each change, as describeChange says it. */
  | { type: 'RANK_STALE'; localRank: number; changes: IdentityChange[]; described: string }
  /** Binding, locking or serving failed. */
  | { type: 'RANK_FAILED'; localRank: number; error: SerializedError };

/** From the supervisor (or a model actor) to a serve actor. */
export type ServeCommand =
  /**
   * The memory is freed, answer the pending release(s) ok. (Freeing that fails fails the node;
   * the waiting clients then see their connection close.)
   */
  | { type: 'SERVE_RELEASED' }
  /** Every rank of the model serves: tell the connections that watch it (model_ready). */
  | { type: 'SERVE_ANNOUNCE' }
  /** A rollback made its version current: the newest of its name on its socket, announced again (model_ready). */
  | { type: 'SERVE_PROMOTE' }
  /** Unload: no new lease; free once the last lease ends, or at once with force (revoking them). */
  | { type: 'SERVE_DRAIN'; force: boolean }
  /** The rank's adopted descriptors passed their check, or failed it with `error` (RankService.descriptorsChecked). */
  | { type: 'SERVE_DESCRIPTORS_CHECKED'; error?: SerializedError };

export interface RankServiceInput {
  rank: ServedRankData;
  /** Which version of its model this rank serves (ServeOptions.version): status counts its leases by it. */
  version: string;
  socketDir?: string;
  log: Logger;
  limits?: Partial<ServeLimits>;
  /**
   * The node's device sockets, which also hold the device locks taken before loading
   * (prepareNode), so that a second daemon fails in milliseconds, not after loading.
   */
  servers: ServerRegistry;
  /** RankServiceOptions.descriptorsChecking: its adopted descriptors' check had not ended when it was spawned. */
  descriptorsChecking?: boolean;
}
