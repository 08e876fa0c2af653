// Two nodes whose checkpoints differ only in tensor bytes (the content fingerprint field) do
// not form a group, and the refusal says why: the join carries the per-field hashes, so node 0
// names "content" rather than an unexplained "fingerprint".
import { cpSync, openSync, closeSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { checkJoin, type GroupExpectation } from '../../src/rendezvous/checkJoin.js';
import { encodeRdzvMessage, parseClientMessage, RDZV_PROTOCOL_VERSION, type JoinMessage } from '../../src/rendezvous/groupMessages.js';
import { FRAME_HEADER_BYTES } from '../../src/wire/frameCodec.js';
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

    const expect: GroupExpectation = { nnodes: 2, tpSize: 2, localWorldSize: 1, fingerprint: mine.fingerprint, fingerprintFields: mine.fingerprintFields };
    const joinMessage: JoinMessage = {
      type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, nnodes: 2, tpSize: 2, localWorldSize: 1, nodeRank: 1, hostName: 'b',
      deviceUuids: ['GPU-b0'], visibleDevices: 1, fingerprint: theirs.fingerprint, fingerprintFields: theirs.fingerprintFields, tokenProof: null,
    };
    // Through the wire, as node 0 reads it: the fields must survive the schema.
    const wire = parseClientMessage(encodeRdzvMessage(joinMessage).subarray(FRAME_HEADER_BYTES));
    assert.ok('message' in wire && wire.message.type === 'join');
    const rejection = checkJoin(wire.message as JoinMessage, '10.0.0.2:6000', expect, 'n'.repeat(32), [{ nodeRank: 0, hostName: 'a', address: '', deviceUuids: ['GPU-a0'] }]);
    assert.is(rejection?.code, 'E_RDZV_FINGERPRINT_MISMATCH');
    assert.is(rejection?.details.field, 'fingerprint');
    assert.equal(rejection?.details.fields, ['content']);
    assert.match(rejection!.message, /\(fields that differ: content\)$/);

    // A join without fields (an older node) is still refused, naming the fingerprint.
    const { fingerprintFields: _, ...bare } = joinMessage;
    const old = checkJoin(bare, '10.0.0.2:6000', expect, 'n'.repeat(32), []);
    assert.is(old?.code, 'E_RDZV_FINGERPRINT_MISMATCH');
    assert.equal(old?.details.fields, ['fingerprint']);
  } finally {
    removeDir(root);
  }
});

test.run();
