// A host arena the daemon cuts into segments by default (issue 33: 256 MiB, 4 segments at tp=1,
// 2 a rank at tp=2): each client maps every segment and gets every tensor's bytes as the files
// hold them, the marks at each tensor's start and end included (test/helpers/sparseLlama.ts).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { expectedFingerprint, findSocket } from '../../src/client/index.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon, type Daemon } from '../helpers/daemon.js';
import { writeSparseLlama } from '../helpers/sparseLlama.js';
import { expectedRank } from '../serve/checkpointOracle.js';
import { runClient, type ClientLanguage } from './runClient.js';

interface HashesReply {
  tensors: Record<string, { sha256: string; shape: number[] }>;
  mapsWhileAttached: number;
  mapsAfter: number;
}

const model = makeTempDir('host-seg-attach');
await writeSparseLlama(model, 8);

for (const [tp, segments] of [[1, 4], [2, 2]] as const) {
  test(`tp=${tp}: ${segments} segments a rank, every one mapped, every tensor's bytes the files' (ts + python)`, async () => {
    const socketDir = `${makeTempDir('sock')}/s`;
    let daemon: Daemon | undefined;
    try {
      daemon = await startDaemon({ model, tp, socketDir });
      assert.match(daemon.stderr(), new RegExp(`rank 0 allocated .* \\(${segments} segments\\)`));
      for (let rank = 0; rank < tp; rank++) {
        const socket = await findSocket({ socketDir, globalRank: rank });
        const expected = expectedRank(model, tp, rank);
        const fingerprint = await expectedFingerprint(model, tp, rank);
        for (const lang of ['ts', 'python'] as ClientLanguage[]) {
          const got = await runClient<HashesReply>(lang, 'hashes', socket, fingerprint, 'map');
          const where = `${lang} rank ${rank}/${tp}`;
          assert.equal(Object.keys(got.tensors).sort(), [...expected.keys()].sort(), `${where}: tensor names`);
          for (const [name, want] of expected) {
            assert.is(got.tensors[name]!.sha256, want.sha256, `${where}: bytes of ${name}`);
            assert.equal(got.tensors[name]!.shape, want.shape, `${where}: shape of ${name}`);
          }
          assert.is(got.mapsWhileAttached, segments, `${where}: each segment mapped`);
          assert.is(got.mapsAfter, 0, `${where}: no mapping left after detach`);
        }
      }
    } finally {
      await daemon?.stop();
      removeDir(socketDir.slice(0, -2));
    }
  });
}

test.after(() => removeDir(model));
test.run();
