// The TypeScript client asks get_state for the packed manifest (docs/spec/manifest-packed.md) and
// reads the frame after the reply as it: against a scripted socket, a good one gives the vector's
// tensors; a malformed one is E_BAD_MANIFEST naming the byte, and its lease is given back; a
// frame of another length than the reply announced is E_BAD_REPLY.
import { readFileSync } from 'node:fs';
import { createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { WeightdClient } from '../../src/client/index.js';
import { encodeMessage, FRAME_HEADER_BYTES, FrameDecoder, MAX_REQUEST_BYTES } from '../../src/wire/frameCodec.js';
import { makeTempDir, removeDir } from '../helpers/checkpoints.js';
import { repoRoot } from '../helpers/paths.js';

interface Vectors {
  valid: Array<{ tensors: unknown[]; packed: string }>;
  invalid: Array<{ packed: string; at: number; mentions: string }>;
}
const vectors = JSON.parse(readFileSync(join(repoRoot, 'test/vectors/manifest-packed.json'), 'utf8')) as Vectors;
const good = Buffer.from(vectors.valid[1]!.packed, 'hex');
const bad = vectors.invalid.find((v) => v.mentions.includes('dtype index'))!;

const state = {
  ok: true, status: 'ok', mode: 'map', leaseId: 'L1', fingerprint: 'f', backend: 'host', layout: 'checkpoint', aliases: {}, segments: [],
  device: { uuid: 'host-0', backend: 'host', index: 0, name: 'host' },
  rank: { globalRank: 0, localRank: 0, nodeRank: 0, nnodes: 1, tpSize: 1 },
};

/** A frame around raw bytes (a packed manifest's frame), as the daemon writes it. */
function rawFrame(payload: Buffer): Buffer {
  const head = encodeMessage({}).subarray(0, FRAME_HEADER_BYTES);
  head.writeUInt32BE(payload.length, 6);
  return Buffer.concat([head, payload]);
}

test('get_state reads the packed manifest after its reply; a malformed one is refused and its lease given back', async () => {
  const dir = makeTempDir('packed-reply');
  const path = join(dir, 's.sock');
  const seen: Array<Record<string, unknown>> = [];
  // What the i-th get_state is answered with: the packed payload and the length its reply announces.
  const packedReplies: Array<[Buffer, number]> = [[good, good.length], [Buffer.from(bad.packed, 'hex'), bad.packed.length / 2], [good, 7]];
  const server = createServer((socket: Socket) => {
    const decoder = new FrameDecoder(MAX_REQUEST_BYTES);
    socket.on('data', (chunk) => {
      for (const frame of decoder.push(chunk)) {
        const req = JSON.parse(frame.toString('utf8')) as Record<string, unknown>;
        seen.push(req);
        if (req.cmd === 'get_state') {
          const [payload, announced] = packedReplies.shift()!;
          socket.write(Buffer.concat([encodeMessage({ id: req.id, ...state, packed: announced }), rawFrame(payload)]));
        } else {
          socket.write(encodeMessage({ id: req.id, ok: true, dropped: 1 }));
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(path, resolve));
  try {
    const client = await WeightdClient.connect(path, { timeoutMs: 5000 });
    const got = await client.getState({ fingerprint: 'f' }, 'map');
    assert.equal([seen[0]!.packed, seen[0]!.columns], [true, true], 'asks for packed, and for columns from a daemon older than packing');
    assert.equal((got as { tensors: unknown }).tensors, vectors.valid[1]!.tensors);

    const refused = await client.getState({ fingerprint: 'f' }, 'map').then(() => undefined, (err: Error & { code?: string }) => err);
    assert.is(refused?.code, 'E_BAD_MANIFEST');
    assert.ok(refused!.message.includes(`at byte ${bad.at}: `), refused!.message);
    assert.equal([seen[2]!.cmd, seen[2]!.leaseId], ['detach', 'L1'], 'the lease of a refused manifest is given back');

    const cut = await client.getState({ fingerprint: 'f' }, 'map').then(() => undefined, (err: Error & { code?: string }) => err);
    assert.is(cut?.code, 'E_BAD_REPLY');
    assert.ok(cut!.message.includes('announced 7'), cut!.message);
    assert.equal([seen[4]?.cmd, seen[4]?.leaseId], ['detach', 'L1'], 'the lease of a reply whose packed manifest was cut is given back');
    client.close();
  } finally {
    server.close();
    removeDir(dir);
  }
});

test.run();
