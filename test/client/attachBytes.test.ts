// Every tensor a client gets, zero-copy or copied, from TypeScript or Python, is byte-identical to
// the checkpoint slice computed independently from the safetensors files (tp=1 and tp=2); and a
// stopped daemon leaves nothing in its socket directory.
import { existsSync, statSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket, readNodeManifest } from '../../src/client/index.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon, type Daemon } from '../helpers/daemon.js';
import { exampleModel } from '../helpers/paths.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import { runClient, type ClientLanguage } from './runClient.js';

interface Described {
  sha256: string;
  shape: number[];
  ctor: string;
}
interface HashesReply {
  tensors: Record<string, Described>;
  mapsWhileAttached: number;
  mapsAfter: number;
  fdsWhileAttached: number;
  fdsAfter: number;
}

/** The view each client must give a dtype (the example checkpoint is BF16). */
const VIEW: Record<ClientLanguage, Record<string, string>> = {
  ts: { BF16: 'Uint16Array', F32: 'Float32Array' },
  python: { BF16: 'torch.bfloat16', F32: 'torch.float32' },
  'python-numpy': { BF16: 'uint16', F32: 'float32' },
  'python-memoryview': { BF16: 'memoryview:H', F32: 'memoryview:f' },
};

for (const tp of [1, 2]) {
  test(`tp=${tp}: every rank's tensors equal the checkpoint slices (ts + python, map + copy)`, async () => {
    const socketDir = `${makeTempDir('sock')}/s`;
    let daemon: Daemon | undefined;
    try {
      daemon = await startDaemon({ model: exampleModel, tp, socketDir });
      const manifest = readNodeManifest(socketDir);
      assert.ok(manifest, 'node manifest written once ready');
      assert.is(manifest!.ranks.length, tp);
      assert.equal(
        manifest!.group?.rankTable.map((r) => [r.globalRank, r.nodeRank, r.localRank, r.deviceUuid]),
        manifest!.ranks.map((r) => [r.globalRank, 0, r.localRank, r.deviceUuid]),
        'the rank table in the manifest matches the served ranks',
      );
      assert.equal([manifest!.group?.nnodes, manifest!.group?.tpSize], [1, tp]);
      assert.is(statSync(`${socketDir}/node.json`).mode & 0o777, 0o600);
      for (let rank = 0; rank < tp; rank++) {
        const socket = await findSocket({ socketDir, globalRank: rank });
        assert.is(statSync(socket).mode & 0o777, 0o600, 'socket mode');
        assert.is(manifest!.ranks[rank]!.socketPath, socket);
        const expected = expectedRank(exampleModel, tp, rank);
        const fingerprint = await expectedFingerprint(exampleModel, tp, rank);
        assert.is(manifest!.ranks[rank]!.fingerprint, fingerprint.fingerprint);
        for (const lang of Object.keys(VIEW) as ClientLanguage[]) {
          for (const mode of ['map', 'copy']) {
            const got = await runClient<HashesReply>(lang, 'hashes', socket, fingerprint, mode);
            const where = `${lang} ${mode} rank ${rank}/${tp}`;
            assert.equal(Object.keys(got.tensors).sort(), [...expected.keys()].sort(), `${where}: tensor names`);
            for (const [name, want] of expected) {
              const t = got.tensors[name]!;
              assert.is(t.sha256, want.sha256, `${where}: bytes of ${name}`);
              assert.equal(t.shape, want.shape, `${where}: shape of ${name}`);
              assert.is(t.ctor, VIEW[lang][want.dtype], `${where}: view type of ${name} (${want.dtype})`);
            }
            if (mode === 'map') assert.ok(got.mapsWhileAttached > 0, `${where}: segments were mapped`);
            assert.is(got.mapsAfter, 0, `${where}: no mapping left after detach`);
            // The clients close each received descriptor once mapped; CPython's mmap keeps a dup of
            // its own until the mapping closes (before 3.13, which the client tells not to).
            if (lang === 'ts') assert.is(got.fdsWhileAttached, 0, `${where}: each received descriptor closed once mapped`);
            else assert.ok(got.fdsWhileAttached <= got.mapsWhileAttached, `${where}: ${got.fdsWhileAttached} descriptors for ${got.mapsWhileAttached} mappings`);
            assert.is(got.fdsAfter, 0, `${where}: no descriptor left after detach`);
          }
        }
      }
      const { code } = await daemon.stop();
      assert.is(code, 0);
      // The daemon made this directory, so it removes it once its socket, lock and manifest are gone.
      assert.not.ok(existsSync(socketDir), 'socket dir the daemon created is removed with its files');
    } finally {
      await daemon?.stop();
      removeDir(socketDir.slice(0, -2));
    }
  });
}

test.run();
