// node.json and the device locks sit in the socket directory, where a FIFO could be planted
// under their names: the daemon and clients then fail at once with an error naming the file's
// type, instead of blocking the main thread forever in open(2).
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { nodeManifestPath } from '../../src/wire/nodeManifest.js';
import { lockPathFor } from '../../src/wire/socketDir.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { runFixture } from '../helpers/runFixture.js';

const fixture = fileURLToPath(new URL('./fixtures/readPlantedFile.js', import.meta.url));

async function plantedFifo(kind: 'manifest' | 'lock', code: string): Promise<void> {
  const dir = makeTempDir(`planted-${kind}`);
  try {
    const uuid = 'GPU-planted';
    execFileSync('mkfifo', [kind === 'manifest' ? nodeManifestPath(dir) : lockPathFor(dir, uuid)]);
    const ended = await runFixture(fixture, [kind, dir, uuid]);
    const result = JSON.parse(ended.stdout) as { code?: string; message?: string };
    assert.is(result.code, code);
    assert.match(result.message!, /is a FIFO \(named pipe\), not a regular file/);
  } finally {
    removeDir(dir);
  }
}

test('node.json is a FIFO: E_NODE_MANIFEST naming it, without blocking', () => plantedFifo('manifest', 'E_NODE_MANIFEST'));
test('a device lock is a FIFO: E_LOCK naming it, without blocking', () => plantedFifo('lock', 'E_LOCK'));

test.run();
