// node.json as the supervisor's publish actor writes it (src/actors/publishNodeManifest.ts): a
// change of where clients find their sockets is in the file when REPUBLISH returns; a change of
// versions alone reaches it once the actor's wait is over, once for every such change meanwhile;
// content the file holds already is not written again; and nothing is written after the node stops.
import { existsSync, readFileSync } from 'node:fs';
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createActor, createMachine } from 'xstate';
import { publishNodeManifest } from '../../src/actors/publishNodeManifest.js';
import type { NodeManifestContent } from '../../src/machines/supervisorActors.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';

/** The publisher's wait for a change of versions alone, in these tests. */
const AFTER_MS = 20;
/** Every timer due by AFTER_MS from now has fired (Node runs timers in the order they fall due). */
const theWait = () => new Promise<void>((resolve) => setTimeout(resolve, AFTER_MS));

function content(versions: { name: string; fingerprint: string; draining?: boolean; socket?: string }[]): NodeManifestContent {
  const rank = (fingerprint: string, socket = '/s/GPU-0.sock') => ({ globalRank: 0, localRank: 0, socketPath: socket, deviceUuid: 'GPU-0', fingerprint });
  return {
    entries: [rank(versions[0]!.fingerprint)],
    models: versions.map((v) => ({ name: v.name, fingerprint: v.fingerprint, tpSize: 1, draining: v.draining ?? false, ranks: [rank(v.fingerprint, v.socket)] })),
    group: { nodeRank: 0, nnodes: 1, tpSize: 1, rankTable: [] },
  };
}

/** The publish actor run by a parent that forwards it REPUBLISH, as the supervisor does; what the file holds; how often it was written. */
function publisher(socketDir: string, first: NodeManifestContent) {
  const writes: string[] = [];
  const counted = pino({ level: 'info' }, { write: (line: string) => void (line.includes('node manifest written') && writes.push(line)) });
  const parent = createActor(
    createMachine({
      invoke: { id: 'publish', src: publishNodeManifest, input: { socketDir, manifest: first, log: counted, versionsAfterMs: AFTER_MS } },
      on: { '*': { actions: ({ event, self }) => self.getSnapshot().children.publish?.send(event as never) } },
    }),
  );
  parent.start();
  const read = () => (existsSync(`${socketDir}/node.json`) ? (JSON.parse(readFileSync(`${socketDir}/node.json`, 'utf8')) as { models: { name: string; fingerprint: string; draining: boolean }[] }) : undefined);
  const versions = () => read()?.models.map((m) => `${m.name}:${m.fingerprint}${m.draining ? ' draining' : ''}`);
  return { republish: (manifest: NodeManifestContent) => parent.send({ type: 'REPUBLISH', manifest }), versions, writes, stop: () => parent.stop() };
}

test('a new name is in node.json when REPUBLISH returns; new versions of a name reach it after the wait, written once for all of them', async () => {
  const dir = makeTempDir('weightd-publish-manifest-');
  try {
    const p = publisher(dir, content([{ name: 'a', fingerprint: 'f0' }]));
    assert.equal(p.versions(), ['a:f0'], 'the first manifest at once');
    p.republish(content([{ name: 'a', fingerprint: 'f0' }, { name: 'b', fingerprint: 'g0', socket: '/s/GPU-0.sock' }]));
    assert.equal(p.versions(), ['a:f0', 'b:g0'], 'a name added: written before REPUBLISH returns');
    const before = p.writes.length;
    p.republish(content([{ name: 'a', fingerprint: 'f0' }, { name: 'b', fingerprint: 'g0' }, { name: 'a', fingerprint: 'f1' }]));
    p.republish(content([{ name: 'a', fingerprint: 'f0', draining: true }, { name: 'b', fingerprint: 'g0' }, { name: 'a', fingerprint: 'f1' }]));
    assert.equal(p.versions(), ['a:f0', 'b:g0'], 'versions alone: not written yet');
    await theWait();
    assert.equal(p.versions(), ['a:f0 draining', 'b:g0', 'a:f1'], 'after the wait: the last of them');
    assert.is(p.writes.length, before + 1, 'the two changes were written once');
    p.republish(content([{ name: 'a', fingerprint: 'f0', draining: true }, { name: 'b', fingerprint: 'g0' }, { name: 'a', fingerprint: 'f1' }]));
    await theWait();
    assert.is(p.writes.length, before + 1, 'content the file holds already is not written again');
    p.republish(content([{ name: 'a', fingerprint: 'f1' }, { name: 'b', fingerprint: 'g0', socket: '/s/GPU-1.sock' }]));
    assert.equal(p.versions(), ['a:f1', 'b:g0'], "a socket moved: written at once");
    p.stop();
    assert.is(p.versions(), undefined, 'removed when the node stops');
  } finally {
    removeDir(dir);
  }
});

test('a change of versions pending when the node stops is never written', async () => {
  const dir = makeTempDir('weightd-publish-manifest-');
  try {
    const p = publisher(dir, content([{ name: 'a', fingerprint: 'f0' }]));
    p.republish(content([{ name: 'a', fingerprint: 'f0' }, { name: 'a', fingerprint: 'f1' }]));
    p.stop();
    await theWait();
    assert.is(p.versions(), undefined, 'no node.json after the stop');
  } finally {
    removeDir(dir);
  }
});

test.run();
