// Two nodes whose checkpoints differ only in tensor bytes (the content fingerprint field) do
// not form a group: the join is refused as any fingerprint mismatch is. The join carries the
// checkpoint fingerprint alone, so the refusal names "fingerprint", not "content"; naming the
// field needs the fields on the wire (see the report of the fingerprint work).
import { cpSync, openSync, closeSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { checkJoin, type GroupExpectation } from '../../src/rendezvous/checkJoin.js';
import { RDZV_PROTOCOL_VERSION } from '../../src/rendezvous/wire.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { exampleModel } from '../helpers/paths.js';

test('a node whose tensor bytes differ is refused at the rendezvous', async () => {
  const root = makeTempDir('rdzv-content');
  try {
    const copy = join(root, 'model');
    cpSync(exampleModel, copy, { recursive: true });
    const file = join(copy, 'model-00002-of-00002.safetensors');
    const { tensors } = await parseSafetensors(file);
    const fd = openSync(file, 'r+');
    writeSync(fd, Buffer.alloc(4096, 0x5a), 0, 4096, tensors[0]!.begin + 512);
    closeSync(fd);
    const [mine, theirs] = [await planCheckpoint(exampleModel, { tpSize: 2 }), await planCheckpoint(copy, { tpSize: 2 })];
    const differing = Object.keys(mine.fingerprintFields).filter((k) => mine.fingerprintFields[k] !== theirs.fingerprintFields[k]);
    assert.equal(differing, ['content']);

    const expect: GroupExpectation = { nnodes: 2, tpSize: 2, localWorldSize: 1, fingerprint: mine.fingerprint };
    const rejection = checkJoin({
      type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, nnodes: 2, tpSize: 2, localWorldSize: 1, nodeRank: 1, hostName: 'b',
      deviceUuids: ['GPU-b0'], visibleDevices: 1, fingerprint: theirs.fingerprint, tokenProof: null,
    }, '10.0.0.2:6000', expect, 'n'.repeat(32), [{ nodeRank: 0, hostName: 'a', address: '', deviceUuids: ['GPU-a0'] }]);
    assert.is(rejection?.code, 'E_RDZV_FINGERPRINT_MISMATCH');
    assert.is(rejection?.details.field, 'fingerprint');
  } finally {
    removeDir(root);
  }
});

test.run();
