// Against a running daemon: a client that computed its fingerprint from a copy whose tensor
// bytes differ is refused with "content" named, and the fingerprint the Python client computes
// without Node (weightd_client.expected_fingerprint) is the one the daemon serves.
import { spawnSync } from 'node:child_process';
import { closeSync, cpSync, openSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { expectedFingerprint, findSocket, type Expected } from '../../src/client/index.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { startDaemon, type Daemon } from '../helpers/daemon.js';
import { exampleModel, repoRoot } from '../helpers/paths.js';
import { PYTHON, runClient } from './runClient.js';

const pythonEnv = { ...process.env, PYTHONPATH: join(repoRoot, 'clients/python'), PYTHONDONTWRITEBYTECODE: '1' };
const pythonHashes = spawnSync(PYTHON, ['-c', 'import xxhash, rfc8785'], { env: pythonEnv }).status === 0;
if (!pythonHashes) console.log(`SKIPPED: the Python fingerprint: ${PYTHON} lacks xxhash or rfc8785 (pip install ./clients/python)`);

let dir = '';
let daemon: Daemon;
let socket = '';
test.before(async () => {
  dir = makeTempDir('content');
  daemon = await startDaemon({ model: exampleModel, tp: 1, socketDir: `${dir}/s` });
  socket = await findSocket({ socketDir: `${dir}/s`, globalRank: 0 });
});
test.after(async () => {
  await daemon?.stop();
  removeDir(dir);
});

test('a client whose copy differs in 4 KiB of one tensor gets a mismatch naming content', async () => {
  const copy = join(dir, 'copy');
  cpSync(exampleModel, copy, { recursive: true });
  const file = join(copy, 'model-00001-of-00002.safetensors');
  const { tensors } = await parseSafetensors(file);
  const fd = openSync(file, 'r+');
  writeSync(fd, Buffer.alloc(4096, 0x11), 0, 4096, tensors[3]!.begin + 256);
  closeSync(fd);
  const reply = await runClient<{ mismatch: string[] }>('ts', 'hashes', socket, await expectedFingerprint(copy, 1, 0), 'copy');
  assert.equal(reply.mismatch, ['content']);
});

(pythonHashes ? test : test.skip)('the fingerprint Python computes without Node is the one the daemon serves', async () => {
  const py = spawnSync(PYTHON, ['-c', [
    'import json, sys', 'from weightd_client import expected_fingerprint',
    'e = expected_fingerprint(sys.argv[1], 1, 0)', 'print(json.dumps({"fingerprint": e.fingerprint, "fingerprintFields": e.fields}))',
  ].join('\n'), exampleModel], { env: pythonEnv, encoding: 'utf8' });
  assert.is(py.status, 0, py.stderr);
  const expected = JSON.parse(py.stdout) as Expected;
  assert.equal(expected, await expectedFingerprint(exampleModel, 1, 0));
  const reply = await runClient<{ tensors?: Record<string, unknown>; mismatch?: string[] }>('python-memoryview', 'hashes', socket, expected, 'copy');
  assert.is(reply.mismatch, undefined);
  assert.ok(Object.keys(reply.tensors ?? {}).length > 0);
});

test.run();
