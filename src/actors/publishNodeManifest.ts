// While the node is ready, `node.json` in the socket dir tells clients which socket serves
// which rank of which model; it is written again whenever a model comes or goes (REPUBLISH), and
// removed as soon as the node stops being ready.
import { fromCallback } from 'xstate';
import type { NodeManifestContent, PublishCommand, PublishNodeManifestInput } from '../machines/supervisorActors.js';
import { removeNodeManifest, writeNodeManifest } from '../wire/nodeManifest.js';

export const publishNodeManifest = fromCallback<PublishCommand, PublishNodeManifestInput>(({ input, receive }) => {
  const publish = (m: NodeManifestContent) => {
    try {
      const path = writeNodeManifest(input.socketDir, m.entries, m.group, m.models);
      input.log.info({ path, ranks: m.entries.length, models: m.models.map((x) => x.name) }, 'node manifest written');
    } catch (err) {
      // Clients can still find sockets by device; a missing manifest is not worth failing for.
      input.log.warn({ err }, 'cannot write the node manifest');
    }
  };
  publish(input.manifest);
  receive((cmd) => publish(cmd.manifest));
  return () => removeNodeManifest(input.socketDir);
});
