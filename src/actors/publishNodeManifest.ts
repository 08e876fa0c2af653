// While the node is ready, `node.json` in the socket dir tells clients which socket serves
// which rank; it is removed as soon as the node stops being ready.
import { fromCallback } from 'xstate';
import type { Logger } from '../log.js';
import { removeNodeManifest, writeNodeManifest, type NodeGroupInfo, type NodeManifestEntry } from '../serve/nodeManifest.js';

export interface PublishNodeManifestInput {
  socketDir: string;
  entries: NodeManifestEntry[];
  group: NodeGroupInfo;
  log: Logger;
}

export const publishNodeManifest = fromCallback<{ type: string }, PublishNodeManifestInput>(({ input }) => {
  try {
    const path = writeNodeManifest(input.socketDir, input.entries, input.group);
    input.log.info({ path, ranks: input.entries.length }, 'node manifest written');
  } catch (err) {
    // Clients can still find sockets by device; a missing manifest is not worth failing for.
    input.log.warn({ err }, 'cannot write the node manifest');
  }
  return () => removeNodeManifest(input.socketDir);
});
