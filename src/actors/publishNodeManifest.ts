// While the node is ready, `node.json` in the socket dir tells clients which socket serves which
// rank of which model; it is written again whenever a model comes or goes (REPUBLISH), and
// removed as soon as the node stops being ready.
//
// A change that moves no client's way to its socket (the same names, ranks and sockets: a new
// version of a model, a version that drains or goes) is written a turn of the event loop later,
// once for all such changes of that turn: a writer's commit publishes its version through several
// such changes, and writing the file (a create, a write, a rename) in each took 0.8-1.2 ms of the
// commit's reply on the development VM (issue 31). What a client is routed by is written at once,
// so a reply that says a model loaded or went finds node.json saying so already. Content the file
// holds already is not written again.
import { fromCallback } from 'xstate';
import type { NodeManifestContent, PublishCommand, PublishNodeManifestInput } from '../machines/supervisorActors.js';
import { removeNodeManifest, writeNodeManifest } from '../wire/nodeManifest.js';

export const publishNodeManifest = fromCallback<PublishCommand, PublishNodeManifestInput>(({ input, receive }) => {
  let written: { routes: string; content: string } | undefined;
  let later: { manifest: NodeManifestContent; at: NodeJS.Immediate } | undefined;
  const publish = (m: NodeManifestContent, routes = routesOf(m)) => {
    if (later) clearImmediate(later.at);
    later = undefined;
    const content = JSON.stringify(m);
    if (content === written?.content) return;
    try {
      const path = writeNodeManifest(input.socketDir, m.entries, m.group, m.models);
      written = { routes, content };
      input.log.info({ path, ranks: m.entries.length, models: m.models.map((x) => x.name) }, 'node manifest written');
    } catch (err) {
      // Clients can still find sockets by device; a missing manifest is not worth failing for.
      input.log.warn({ err }, 'cannot write the node manifest');
    }
  };
  publish(input.manifest);
  receive(({ manifest }) => {
    const routes = routesOf(manifest);
    if (written === undefined || routes !== written.routes) return publish(manifest, routes);
    if (later) later.manifest = manifest;
    else later = { manifest, at: setImmediate(() => later && publish(later.manifest)) };
  });
  return () => {
    if (later) clearImmediate(later.at);
    later = undefined;
    removeNodeManifest(input.socketDir);
  };
});

/** What a client finds its socket by: each model name's ranks and their sockets and devices, the node's own ranks, and the group. */
function routesOf(m: NodeManifestContent): string {
  const route = (r: { globalRank: number; socketPath: string; deviceUuid: string }) => `${r.globalRank} ${r.socketPath} ${r.deviceUuid}`;
  const models = new Set(m.models.flatMap((x) => x.ranks.map((r) => `${x.name} ${x.tpSize} ${route(r)}`)));
  return JSON.stringify([m.entries.map(route), [...models].sort(), m.group]);
}
