// The rank service actor (the serve actor): serves one resident rank of one model version, as a
// RankService (src/serve/rankService.ts), on its device's Unix socket (shared with the device's
// other models: src/serve/serverRegistry.ts) for as long as its parent keeps it. A client's
// allowed release, or the end of a drain, is handed to the parent (RANK_RELEASE_REQUESTED), which
// frees the memory and answers SERVE_RELEASED; only then do the waiting clients hear that it is
// done. Stopping the actor withdraws the rank synchronously (the socket and lock go with the
// device's last one).
import { fromCallback } from 'xstate';
import { serializeError } from '../errors.js';
import { RankService } from '../serve/rankService.js';
import type { ServeCommand, ServeEvent, RankServiceInput } from '../serve/serveEvents.js';

export { writeNodeManifest, removeNodeManifest, type NodeManifestEntry } from '../wire/nodeManifest.js';

export const rankServiceActor = fromCallback<ServeCommand, RankServiceInput, ServeEvent>(({ input, sendBack, receive }) => {
  const { localRank } = input.rank;
  let released: (() => void) | undefined;
  const service = new RankService({
    rank: input.rank,
    log: input.log,
    // RankService calls this at most once and makes later releases wait on the same promise.
    freeMemory: () =>
      new Promise<void>((resolve) => {
        released = resolve;
        sendBack({ type: 'RANK_RELEASE_REQUESTED', localRank });
      }),
    onStale: (changes, described) => sendBack({ type: 'RANK_STALE', localRank, changes, described }),
    ...(input.descriptorsChecking ? { descriptorsChecking: true } : {}),
  });

  receive((cmd) => {
    switch (cmd.type) {
      case 'SERVE_RELEASED':
        released?.();
        released = undefined;
        break;
      case 'SERVE_ANNOUNCE':
        service.notifier?.announce(service, 'model_ready');
        break;
      case 'SERVE_PROMOTE':
        input.servers.promote(service);
        service.notifier?.announce(service, 'model_ready');
        break;
      case 'SERVE_DRAIN':
        service.drain(cmd.force);
        break;
      case 'SERVE_DESCRIPTORS_CHECKED':
        service.descriptorsChecked(cmd.error);
        break;
    }
  });

  let stopped = false;
  input.servers.serve(service, { version: input.version, socketDir: input.socketDir, log: input.log, limits: input.limits }).then(
    (socketPath) => {
      if (!stopped) sendBack({ type: 'RANK_SERVING', localRank, socketPath });
    },
    (err: unknown) => {
      if (!stopped) sendBack({ type: 'RANK_FAILED', localRank, error: serializeError(err) });
    },
  );

  return () => {
    stopped = true;
    // A get_segment_fds still waiting for the check is refused, not left hanging.
    service.descriptorsChecked({ name: 'ServeError', code: 'E_RELEASED', message: `rank ${input.rank.globalRank} was withdrawn before its adopted descriptors were checked; ask again (a restarted daemon serves it anew)` });
    input.servers.withdraw(service);
  };
});
