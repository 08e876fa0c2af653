// A host fill digests each tensor as its chunks pass (native/host_device.cpp), its chunks cut at
// digest piece starts, so a rank that copies every tensor whole (tp=1) reads no byte twice;
// only what its reads do not hold whole (a tp=2 rank's half of a sharded tensor) is read again
// at the end. The count is the fill's digestRereadBytes. A node's host ranks share the hashing
// (native/host_digest_group.h): each piece is hashed by whichever rank reads it whole first, and
// only what no rank read whole is read again, once, by the last rank to finish.
import { readFileSync, rmSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { diskDigests } from '../../src/native/diskDigests.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { writeArchCheckpoint } from '../helpers/checkpoints.js';
import { freshTempDir } from '../helpers/paths.js';
import { addon } from '../../src/native/addon.js';
import type { FillProgress } from '../../src/native/deviceHandle.js';
import type { CheckpointPlan } from '../../src/checkpoint/types.js';

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

/**
 * Runs `body` with the tp=2 plan of a small Llama (`intermediate` wide), its disk digests, and a
 * host device per rank, allocated; frees them and removes the checkpoint after.
 */
async function withTp2Ranks(tag: string, body: (ranks: Tp2Ranks) => Promise<void>, intermediate = 1536): Promise<void> {
  const dir = freshTempDir();
  await writeArchCheckpoint(dir, 'LlamaForCausalLM', { hidden: 512, heads: 8, kvHeads: 4, intermediate, vocab: 4096, layers: 2 });
  const plan = await planCheckpoint(dir, { tpSize: 2 });
  const devices = plan.ranks.map((_, i) => new DeviceHandle('host', i, { uuid: `${tag}-${process.pid}-${i}` }));
  try {
    for (const [i, d] of devices.entries()) await d.allocate(plan.ranks[i]!.segments);
    const fill: Tp2Ranks['fill'] = (i, group, tensorRanges = plan.ranks[i]!.contentTensors.ranges, onProgress) => {
      const rank = plan.ranks[i]!;
      return devices[i]!.fill(rank.files, rank.ops, rank.totalBytes, { threads: 2, zeroRanges: rank.zeroRanges, tensorRanges, group }, onProgress);
    };
    await body({ plan, want: await diskDigests(plan, 2), devices, fill });
  } finally {
    await Promise.all(devices.map((d) => d.free()));
    rmSync(dir, { recursive: true, force: true });
  }
}

type TensorRanges = CheckpointPlan['ranks'][number]['contentTensors']['ranges'];

interface Tp2Ranks {
  plan: CheckpointPlan;
  want: string[];
  devices: DeviceHandle[];
  /** Rank i's fill, in `group` if given, digesting `tensorRanges` (default: the plan's). */
  fill(i: number, group?: { id: string; size: number }, tensorRanges?: TensorRanges, onProgress?: (p: FillProgress) => void): ReturnType<DeviceHandle['fill']>;
}

/** `fill`'s error as "CODE: message", or 'no error'. */
async function outcome(fill: Promise<unknown>): Promise<string> {
  try {
    await fill;
    return 'no error';
  } catch (err) {
    return `${(err as { code?: string }).code}: ${(err as Error).message}`;
  }
}

test('the ranks of a host digest group hash each piece once: both get the files\' digests, and only what neither read whole is read again, once', async () => {
  await withTp2Ranks('digest-group', async (ranks) => {
      const alone = await ranks.fill(0);
      const group = await Promise.all([0, 1].map((i) => ranks.fill(i, { id: `together-${process.pid}`, size: 2 })));
      assert.equal(alone.digests, ranks.want);
      for (const g of group) assert.equal(g.digests, ranks.want);
      const reread = group.map((g) => g.digestRereadBytes);
      assert.ok(reread.filter((b) => b > 0).length <= 1, `one rank reads the rest: ${reread}`);
      // Alone, rank 0 read again everything of rank 1's half; together, only the pieces neither
      // read whole (those cut between the halves, and a row-parallel tensor's rows).
      assert.ok(reread[0]! + reread[1]! < alone.digestRereadBytes / 2, `group ${reread}, alone ${alone.digestRereadBytes}`);
  });
});

test('rows far apart (a row-parallel down_proj, 8 KiB of each 16 KiB row a rank): the first rank to reach a chunk reads it whole and hashes it, so the group reads almost nothing again', async () => {
  await withTp2Ranks('digest-rows', async (ranks) => {
      const checkpointBytes = ranks.plan.ranks[0]!.contentTensors.ranges.reduce((n, r) => n + r.end - r.start, 0);
      const group = await Promise.all([0, 1].map((i) => ranks.fill(i, { id: `rows-${process.pid}`, size: 2 })));
      for (const g of group) assert.equal(g.digests, ranks.want);
      const reread = group.reduce((n, g) => n + g.digestRereadBytes, 0);
      // Only pieces cut between two chunks' spans are left: the rows alone would leave every
      // down_proj piece to the second read (29% of this checkpoint).
      assert.ok(reread < 0.02 * checkpointBytes, `read again ${reread} of ${checkpointBytes} bytes`);
  }, 8192);
});

test('a row-parallel chunk is read once for the group: the first rank to reach it writes the other rank\'s columns too, and each arena holds what the rank\'s fill alone writes', async () => {
  await withTp2Ranks('digest-deliver', async (ranks) => {
      const solo = ranks.plan.ranks.map((_, i) => new DeviceHandle('host', i, { uuid: `deliver-solo-${process.pid}-${i}` }));
      try {
        const alone = [];
        for (const [i, d] of solo.entries()) {
          const rank = ranks.plan.ranks[i]!;
          await d.allocate(rank.segments);
          alone.push(await d.fill(rank.files, rank.ops, rank.totalBytes, { threads: 2, zeroRanges: rank.zeroRanges, tensorRanges: rank.contentTensors.ranges }));
        }
        const group = await Promise.all([0, 1].map((i) => ranks.fill(i, { id: `deliver-${process.pid}`, size: 2 })));
        for (const g of group) assert.equal(g.digests, ranks.want);
        for (const a of alone) assert.equal([a.rowsDeliveredBytes, a.rowsReceivedBytes], [undefined, undefined], 'alone, a rank delivers nothing');
        const delivered = group.map((g) => g.rowsDeliveredBytes ?? 0);
        const received = group.map((g) => g.rowsReceivedBytes ?? 0);
        // This checkpoint's down_proj is row-parallel, its rows far apart: 8 KiB of each 16 KiB row a rank.
        // Both ranks offer their rows before either copies, so each chunk of rows is read once and
        // its other columns delivered: in all, one rank's share of those tensors (kMinSkippedGap: 4096).
        const apart = ranks.plan.ranks[0]!.ops.filter((o) => o.rows > 1 && o.srcPitch - o.rowBytes >= 4096).reduce((n, o) => n + o.rows * o.rowBytes, 0);
        assert.ok(apart > 0, 'the checkpoint has rows far apart');
        assert.is(delivered[0]! + delivered[1]!, apart, `delivered ${delivered}`);
        assert.equal([delivered[0], delivered[1]], [received[1], received[0]], 'what one rank wrote for the other is what the other skipped');
        const bytesOf = (d: DeviceHandle) => d.exportSegments().map((s) => readFileSync(`/proc/self/fd/${s.fd}`));
        for (const i of [0, 1]) {
          const [got, want] = [bytesOf(ranks.devices[i]!), bytesOf(solo[i]!)];
          assert.is(got.length, want.length);
          for (const [k, b] of got.entries()) assert.ok(b.equals(want[k]!), `rank ${i} segment ${k} holds the bytes of rank ${i}'s fill alone`);
        }
      } finally {
        await Promise.all(solo.map((d) => d.free()));
      }
  }, 8192);
});

test('a rank that adopted leaves the digest group: the other fills and hashes alone, before or after the leave', async () => {
  await withTp2Ranks('digest-leave', async (ranks) => {
      const alone = await ranks.fill(1);
      addon().leaveFillGroup('host', `left-first-${process.pid}`, 2);
      const first = await ranks.fill(1, { id: `left-first-${process.pid}`, size: 2 });
      let waits!: () => void;
      const waiting = new Promise<void>((resolve) => (waits = resolve));
      const later = ranks.fill(1, { id: `left-later-${process.pid}`, size: 2 }, undefined, (p) => p.waitingForGroup && waits());
      await Promise.race([waiting, later]);
      addon().leaveFillGroup('host', `left-later-${process.pid}`, 2);
      const then = await later;
      for (const filled of [first, then]) {
        assert.equal(filled.digests, ranks.want);
        assert.is(filled.digestRereadBytes, alone.digestRereadBytes, 'alone in its group, a rank reads again what it reads alone');
      }
  });
});

test('a digest group fails as a whole, and no member waits for ever: a member cancelled while waiting, a member whose tensors differ', async () => {
  await withTp2Ranks('digest-fail', async (ranks) => {
      // A rank's fill, once it waits at its end for the others ({ ended }: its outcome).
      const waitingFor = async (i: number, id: string) => {
        let waits!: () => void;
        const waiting = new Promise<void>((resolve) => (waits = resolve));
        const ended = outcome(ranks.fill(i, { id, size: 2 }, undefined, (p) => p.waitingForGroup && waits()));
        await Promise.race([waiting, ended]);
        return { ended };
      };
      // Rank 0 waits at its end for rank 1, and is cancelled: rank 1, arriving later, fails at once.
      const cancelled = await waitingFor(0, `cancel-${process.pid}`);
      ranks.devices[0]!.cancelFill();
      assert.match(await cancelled.ended, /^E_FILL_CANCELLED: fill cancelled/);
      assert.match(await outcome(ranks.fill(1, { id: `cancel-${process.pid}`, size: 2 })), /^E_FILL_CANCELLED: digest group cancel-\d+: another rank's fill failed or was cancelled/);
      // Rank 0 waits; rank 1 names other tensors: it is refused, and rank 0 is told.
      const told = await waitingFor(0, `differ-${process.pid}`);
      const fewer = ranks.plan.ranks[1]!.contentTensors.ranges.slice(1);
      assert.match(await outcome(ranks.fill(1, { id: `differ-${process.pid}`, size: 2 }, fewer)), /^E_BAD_GROUP: digest group differ-\d+: this member's files or tensors differ/);
      assert.match(await told.ended, /^E_FILL_CANCELLED: digest group differ-\d+: a member's files or tensors differ/);
      // Both devices still fill, together, afterwards.
      const after = await Promise.all([0, 1].map((i) => ranks.fill(i, { id: `after-${process.pid}`, size: 2 })));
      for (const filled of after) assert.equal(filled.digests, ranks.want);
  });
});

test.run();
