// A host fill digests each tensor as its chunks pass (native/host_device.cpp), its chunks cut at
// digest piece starts, so a rank that copies every tensor whole (tp=1) reads no byte twice;
// only what its reads do not hold whole (a tp=2 rank's half of a sharded tensor) is read again
// at the end. The count is the fill's digestRereadBytes.
import { rmSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { diskDigests } from '../../src/native/diskDigests.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { writeArchCheckpoint } from '../helpers/checkpoints.js';
import { freshTempDir } from '../helpers/paths.js';

const MiB = 2 ** 20;

test('a tp=1 host fill reads no digest piece again, whatever its chunk size; a tp=2 rank reads its missing halves again', async () => {
  const dir = freshTempDir();
  try {
    await writeArchCheckpoint(dir, 'LlamaForCausalLM', { hidden: 512, heads: 8, kvHeads: 4, intermediate: 1536, vocab: 4096, layers: 2 });
    for (const tp of [1, 2]) {
      const plan = await planCheckpoint(dir, { tpSize: tp });
      const rank = plan.ranks[0]!;
      const want = await diskDigests(plan, 2);
      // Chunks of 1.5 MiB: a piece would straddle two chunks if they were not cut at piece starts.
      for (const chunkBytes of [1.5 * MiB, 4 * MiB]) {
        const device = new DeviceHandle('host', 0, { uuid: `rereads-${process.pid}-${tp}-${chunkBytes}` });
        let filled;
        try {
          await device.allocate(rank.segments);
          filled = await device.fill(rank.files, rank.ops, rank.totalBytes, { threads: 2, chunkBytes, zeroRanges: rank.zeroRanges, tensorRanges: rank.contentTensors.ranges });
        } finally {
          await device.free();
        }
        assert.equal(filled.digests, want, `tp=${tp}, ${chunkBytes} byte chunks`);
        if (tp === 1) assert.is(filled.digestRereadBytes, 0, `tp=1, ${chunkBytes} byte chunks`);
        else assert.ok(filled.digestRereadBytes > 0, `tp=2, ${chunkBytes} byte chunks`);
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
