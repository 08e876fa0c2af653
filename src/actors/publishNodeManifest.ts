// While the node is ready, `node.json` in the socket dir tells clients which socket serves which
// rank of which model; it is written again whenever a model comes or goes (REPUBLISH), and
// removed as soon as the node stops being ready.
//
// A change that moves no client's way to its socket (the same names, ranks and sockets: a new
// version of a model, a version that drains or goes) is written up to VERSIONS_WRITE_AFTER_MS
// later, once for all such changes meanwhile. A writer's commit makes three (its version serves,
// the oldest retained drains, and goes once its last lease ends), and writing the file (a create,
// a write, a rename) took 0.8-1.2 ms of the main thread each on the development VM (issue 31):
// first in the commit's reply, then, written a turn later, beside the engines' switches to the
// new version. A training loop commits every few milliseconds; the file's versions are a listing
// (a client asks its socket which versions serve, docs/operations.md), so they may lag that much.
// What a client is routed by is written at once, so a reply that says a model loaded or went finds
// node.json saying so already. Content the file holds already is not written again.
import { fromCallback } from 'xstate';
import type { NodeManifestContent, PublishCommand, PublishNodeManifestInput } from '../machines/supervisorActors.js';
import { removeNodeManifest, writeNodeManifest } from '../wire/nodeManifest.js';

/** The most a change of versions alone waits to be written (see above). */
export const VERSIONS_WRITE_AFTER_MS = 100;

export const publishNodeManifest = fromCallback<PublishCommand, PublishNodeManifestInput>(({ input, receive }) => {
  let written: { routes: string; content: string } | undefined;
  let later: { manifest: NodeManifestContent; at: NodeJS.Timeout } | undefined;
  const after = input.versionsAfterMs ?? VERSIONS_WRITE_AFTER_MS;
  const publish = (m: NodeManifestContent, routes = routesOf(m)) => {
    if (later) clearTimeout(later.at);
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
    // unref: a pending listing keeps no process alive (a stopping node removes the file anyway).
    else later = { manifest, at: setTimeout(() => later && publish(later.manifest), after).unref() };
  });
  return () => {
    if (later) clearTimeout(later.at);
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
