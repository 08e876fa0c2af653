// A pull's plan (src/serve/cudaPull.ts): each final allocation is written once, whole: the pulled
// tensors from the writer's memory (runs that continue each other as one copy), the other
// tensors' bytes from the base's segment at commit, and the bytes no tensor holds as zeros; only
// segments holding a pulled tensor are copied, and only the pulled tensors (and any sharing bytes
// with one) are digested again, those sharing none as they are pulled.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { batchPlan, commitGaps, pulledCopies, pulledSegments, recordPulls, refuseUnlessPullable, rehashedUnderPull, untensoredBytes, type Pull } from '../../src/serve/cudaPull.js';
import type { ServeError } from '../../src/errors.js';
import type { RankService } from '../../src/serve/rankService.js';

const HANDLE_A = Buffer.alloc(64, 1).toString('base64');
const HANDLE_B = Buffer.alloc(64, 2).toString('base64');

/** Segment 0 (256 bytes): a (0..100), b (128..228), c aliasing a's last 20 bytes; segment 1 (64 bytes): d (0..32), e (32..64). */
function rank(): RankService {
  const t = (name: string, segment: number, offset: number, bytes: number) => ({ name, dtype: 'U8', shape: [bytes], segment, offset, bytes });
  return {
    rank: {
      name: 'm',
      globalRank: 0,
      segments: [
        { segment: 0, bytes: 256 },
        { segment: 1, bytes: 64 },
      ],
      tensors: [t('a', 0, 0, 100), t('b', 0, 128, 100), t('c', 0, 80, 20), t('d', 1, 0, 32), t('e', 1, 32, 32)],
    },
  } as unknown as RankService;
}

const fresh = (): Pull => ({ sources: [], sourceIndex: new Map(), tensors: new Map() });

test('pulled tensors come from their sources, the bytes no tensor holds are zeros, and continuing runs merge', () => {
  const service = rank();
  const pull = fresh();
  // a and b back to back in source A at 1000 and 1128: 28 bytes between them in the layout, so two copies.
  recordPulls(service, pull, [HANDLE_A], [
    { name: 'a', source: 0, offset: 1000, bytes: 100 },
    { name: 'b', source: 0, offset: 1128, bytes: 100 },
  ]);
  const copied = pulledSegments(service, pull);
  assert.equal(copied, [true, false], 'segment 1 holds no pulled tensor: shared');
  assert.equal(pulledCopies(service, pull), [
    { segment: 0, source: 1, srcOffset: 1000, dstOffset: 0, bytes: 100 },
    { segment: 0, source: 1, srcOffset: 1128, dstOffset: 128, bytes: 100 },
  ]);
  // c lies inside a's bytes, which the pull wrote: nothing of the base is copied.
  assert.equal(commitGaps(service, pull, copied), []);
  assert.equal(untensoredBytes(service, copied), [
    { segment: 0, offset: 100, bytes: 28 },
    { segment: 0, offset: 228, bytes: 28 },
  ]);
  // c shares bytes with a: its digest is taken again; d and e, in a shared segment, keep the base's.
  assert.equal(rehashedUnderPull(service, pull), [true, true, true, false, false]);
});

test('tensors packed in the source as in the layout are one copy; a second request adds only the handles it uses', () => {
  const service = rank();
  const pull = fresh();
  recordPulls(service, pull, [HANDLE_B], [
    { name: 'd', source: 0, offset: 500, bytes: 32 },
    { name: 'e', source: 0, offset: 532, bytes: 32 },
  ]);
  recordPulls(service, pull, [HANDLE_A, HANDLE_B], [{ name: 'a', source: 1, offset: 0, bytes: 100 }]);
  assert.equal(pull.sources, [HANDLE_B], 'B once; A, which no tensor names, not at all');
  const copied = pulledSegments(service, pull);
  assert.equal(copied, [true, true]);
  assert.equal(pulledCopies(service, pull), [
    { segment: 0, source: 1, srcOffset: 0, dstOffset: 0, bytes: 100 },
    { segment: 1, source: 1, srcOffset: 500, dstOffset: 0, bytes: 64 },
  ]);
  // b was not pulled: its bytes are the base's; segment 1 is all d and e.
  assert.equal(commitGaps(service, pull, copied), [{ segment: 0, source: 0, srcOffset: 128, dstOffset: 128, bytes: 100 }]);
  assert.equal(untensoredBytes(service, copied), [
    { segment: 0, offset: 100, bytes: 28 },
    { segment: 0, offset: 228, bytes: 28 },
  ]);
});

test("each request's copies run as it comes, opening only the handles it uses, with the zeros of its segments and the digests of its tensors that share no byte; the commit adds the other tensors: every byte once", () => {
  const service = rank();
  const pull = fresh();
  const first = [{ name: 'a', source: 1, offset: 1000, bytes: 100 }];
  const second = [
    { name: 'd', source: 0, offset: 500, bytes: 32 },
    { name: 'e', source: 0, offset: 532, bytes: 32 },
  ];
  recordPulls(service, pull, [HANDLE_B, HANDLE_A], first);
  recordPulls(service, pull, [HANDLE_B], second);
  const early1 = batchPlan(service, [HANDLE_B, HANDLE_A], first);
  const early2 = batchPlan(service, [HANDLE_B], second);
  assert.equal(early1.sources, [Buffer.from(HANDLE_A, 'base64')], 'B, which no tensor of the request names, is not opened');
  assert.equal(early1.segments, [true, false]);
  assert.equal(early2.segments, [false, true]);
  assert.equal(early1.copies, [{ segment: 0, source: 1, srcOffset: 1000, dstOffset: 0, bytes: 100 }]);
  assert.equal(early2.copies, [{ segment: 1, source: 1, srcOffset: 500, dstOffset: 0, bytes: 64 }], 'packed as the layout: one copy');
  assert.equal(early1.zeros, [
    { segment: 0, offset: 100, bytes: 28 },
    { segment: 0, offset: 228, bytes: 28 },
  ]);
  assert.equal(early2.zeros, [], 'd and e fill segment 1');
  // a shares bytes with c (an alias of its last 20): digested at commit, once every pull has written.
  assert.equal(early1.digested, []);
  assert.equal(early2.digested, [
    { index: 3, range: { file: 1, start: 0, end: 32 } },
    { index: 4, range: { file: 1, start: 32, end: 64 } },
  ]);
  const copied = pulledSegments(service, pull);
  const gaps = commitGaps(service, pull, copied);
  assert.equal(gaps, [{ segment: 0, source: 0, srcOffset: 128, dstOffset: 128, bytes: 100 }]);
  // Every byte of the written segments once: pulled early, zeroed early, or the base's at commit.
  const bytes = [256, 64].map((n) => new Array<number>(n).fill(0));
  for (const c of [...early1.copies, ...early2.copies, ...gaps]) for (let b = c.dstOffset; b < c.dstOffset + c.bytes; b++) bytes[c.segment]![b]!++;
  for (const z of [...early1.zeros, ...early2.zeros]) for (let b = z.offset; b < z.offset + z.bytes; b++) bytes[z.segment]![b]!++;
  assert.equal(bytes.map((seg) => seg.every((n) => n === 1)), [true, true]);
});

test('a request with one bad tensor records none of its tensors', () => {
  const service = rank();
  const pull = fresh();
  const code = (f: () => void) => {
    try {
      f();
      return undefined;
    } catch (err) {
      return (err as ServeError).code;
    }
  };
  assert.is(code(() => recordPulls(service, pull, [HANDLE_A], [{ name: 'a', source: 0, offset: 0, bytes: 100 }, { name: 'b', source: 0, offset: 0, bytes: 99 }])), 'E_UPDATE_SIZE');
  assert.is(code(() => recordPulls(service, pull, [HANDLE_A], [{ name: 'a', source: 0, offset: 0, bytes: 100 }, { name: 'zz', source: 0, offset: 0, bytes: 1 }])), 'E_UNKNOWN_TENSOR');
  assert.is(code(() => recordPulls(service, pull, [HANDLE_A], [{ name: 'a', source: 1, offset: 0, bytes: 100 }])), 'E_BAD_REQUEST');
  assert.is(pull.tensors.size, 0);
  assert.is(pull.sources.length, 0);
});

test('a pull is taken on a cuda rank served by descriptor, from a writer on its own GPU (the UUID as the driver or nvidia-smi spells it), with no tensors list', () => {
  const code = (f: () => void) => {
    try {
      f();
      return undefined;
    } catch (err) {
      return (err as ServeError).code;
    }
  };
  const uuid = 'GPU-00010203-0405-0607-0809-0a0b0c0d0e0f';
  const served = (backend: string, handle: string) =>
    ({ rank: { name: 'm', globalRank: 0, backend, device: { uuid, index: 0 }, segments: [{ segment: 0, bytes: 64, handle, fd: 3 }] } }) as unknown as RankService;
  const cuda = served('cuda', 'cuda-fd');
  assert.is(code(() => refuseUnlessPullable(cuda, uuid, undefined)), undefined);
  assert.is(code(() => refuseUnlessPullable(cuda, '00010203-0405-0607-0809-0A0B0C0D0E0F', undefined)), undefined);
  assert.is(code(() => refuseUnlessPullable(served('host', 'fd'), uuid, undefined)), 'E_UPDATE_UNSUPPORTED');
  assert.is(code(() => refuseUnlessPullable(served('cuda', 'AAAA'), uuid, undefined)), 'E_UPDATE_UNSUPPORTED');
  assert.is(code(() => refuseUnlessPullable(cuda, 'GPU-ffffffff-0405-0607-0809-0a0b0c0d0e0f', undefined)), 'E_DEVICE_MISMATCH');
  assert.is(code(() => refuseUnlessPullable(cuda, undefined, undefined)), 'E_BAD_REQUEST');
  assert.is(code(() => refuseUnlessPullable(cuda, uuid, ['a'])), 'E_BAD_REQUEST');
});

test.run();
