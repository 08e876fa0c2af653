// The serve actor: serves one resident rank on its device's Unix socket (src/serve/rankServer.ts)
// for as long as the supervisor keeps it. A client's allowed release is handed to the supervisor
// (RANK_RELEASE_REQUESTED), which frees the memory and answers SERVE_RELEASED; only then do the
// waiting clients hear that it is done. Stopping the actor removes socket and lock synchronously.
import { fromCallback } from 'xstate';
import { serializeError } from '../errors.js';
import type { Logger } from '../log.js';
import type { DeviceLock } from '../serve/deviceLock.js';
import { RankServer } from '../serve/rankServer.js';
import type { ServeLimits } from '../serve/serveLimits.js';
import type { ServeCommand, ServeEvent } from '../serve/serveEvents.js';
import type { ServedRank } from '../serve/servedRank.js';
import type { ServerRegistry } from './serverRegistry.js';

export { writeNodeManifest, removeNodeManifest, type NodeManifestEntry } from '../serve/nodeManifest.js';

export interface ServeRankInput {
  rank: ServedRank;
  socketDir?: string;
  log: Logger;
  /**
   * The device lock, when the node took it before loading (resolveSocketDir + acquireDeviceLock
   * in the prepare step), so that a second daemon fails in milliseconds, not after loading.
   * The actor owns it from then on and removes it at cleanup.
   */
  lock?: DeviceLock;
  limits?: Partial<ServeLimits>;
  /** Where status and metrics find this server's counters while it listens. */
  servers?: ServerRegistry;
}

export const serveRank = fromCallback<ServeCommand, ServeRankInput, ServeEvent>(({ input, sendBack, receive }) => {
  const { localRank } = input.rank;
  let released: (() => void) | undefined;
  const server = new RankServer({
    rank: input.rank,
    socketDir: input.socketDir,
    log: input.log,
    lock: input.lock,
    limits: input.limits,
    // RankServer calls this at most once and makes later releases wait on the same promise.
    freeMemory: () =>
      new Promise<void>((resolve) => {
        released = resolve;
        sendBack({ type: 'RANK_RELEASE_REQUESTED', localRank });
      }),
  });

  receive(() => {
    released?.();
    released = undefined;
  });

  let stopped = false;
  server.listen().then(
    (socketPath) => {
      input.servers?.register(localRank, () => server.stats());
      sendBack({ type: 'RANK_SERVING', localRank, socketPath });
    },
    (err: unknown) => {
      if (!stopped) sendBack({ type: 'RANK_FAILED', localRank, error: serializeError(err) });
    },
  );

  return () => {
    stopped = true;
    input.servers?.unregister(localRank);
    server.close();
  };
});
