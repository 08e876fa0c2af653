// The host backend's segments are sealed memfds: export seals them (write, shrink, grow), so no
// process, the daemon included, can change a served byte; another device adopts the exported
// descriptors and reads the same bytes; adopt refuses descriptors that are not sealed segments,
// too short, or miscounted, and closes every one it was given. The seals are checked from a
// separate process (python3, given the descriptor as its fd 3), not by the addon's own checks.
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { fstatSync, openSync, readdirSync, readlinkSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { DeviceError } from '../../src/errors.js';
import { addon } from '../../src/native/addon.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { openFdCount, weightdMemfds } from '../helpers/memfds.js';
import { freshTempDir } from '../helpers/paths.js';

const KiB = 1024;
const segmentBytes = [64 * KiB, 12 * KiB];

/** A device whose two segments hold a known pattern (not yet exported). */
async function filledDevice(): Promise<{ device: DeviceHandle; data: Buffer }> {
  const data = Buffer.alloc(76 * KiB);
  for (let i = 0; i < data.length; i++) data[i] = (i * 37 + (i >> 10)) & 0xff;
  const file = join(freshTempDir(), 'data');
  writeFileSync(file, data);
  const device = new DeviceHandle('host', 0, { uuid: `memfd-${process.pid}` });
  await device.allocate(segmentBytes);
  const ops = [
    { file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: 64 * KiB, srcPitch: 0 },
    { file: 0, segment: 1, srcOffset: 64 * KiB, dstOffset: 0, rows: 1, rowBytes: 12 * KiB, srcPitch: 0 },
  ];
  await device.fill([file], ops, data.length, {});
  return { device, data };
}

/** What python3 sees of `fd` (its fd 3): the seals and what writing through it does. */
function probe(fd: number): { seals: number; size: number; mmapWrite: string; write: string; truncate: string; mmapRead: number } {
  const script = `
import fcntl, json, mmap, os
out = {"seals": fcntl.fcntl(3, 1034), "size": os.fstat(3).st_size}
def attempt(name, fn):
    try:
        fn(); out[name] = "allowed"
    except OSError as e:
        out[name] = os.strerror(e.errno)
attempt("mmapWrite", lambda: mmap.mmap(3, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
attempt("write", lambda: os.pwrite(3, b"x", 0))
attempt("truncate", lambda: os.ftruncate(3, 0))
m = mmap.mmap(3, 4096, mmap.MAP_SHARED, mmap.PROT_READ)
out["mmapRead"] = m[1]
print(json.dumps(out))
`;
  const r = spawnSync('python3', ['-c', script], { stdio: ['ignore', 'pipe', 'pipe', fd], encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  return JSON.parse(r.stdout);
}

/** A new descriptor of the same memfd (seals and all), as a keeper's copy would be. */
const reopen = (fd: number) => openSync(`/proc/self/fd/${fd}`, 'r');

function isOpen(fd: number): boolean {
  try {
    fstatSync(fd);
    return true;
  } catch {
    return false;
  }
}

async function refusal(p: Promise<unknown>): Promise<DeviceError> {
  return p.then(() => assert.unreachable('adopt accepted it') as never, (e: DeviceError) => e);
}

test('export gives one sealed memfd per segment, which no process can write through', async () => {
  const { device, data } = await filledDevice();
  try {
    const segments = device.exportSegments();
    assert.equal(segments.map((s) => [s.segment, s.bytes, s.handle]), [[0, 64 * KiB, 'memfd'], [1, 12 * KiB, 'memfd']]);
    for (const s of segments) {
      assert.match(readlinkSync(`/proc/self/fd/${s.fd}`), new RegExp(`^/memfd:weightd:memfd-${process.pid}:s${s.segment} \\(deleted\\)$`));
      const seen = probe(s.fd!);
      // F_SEAL_SEAL 1, SHRINK 2, GROW 4, WRITE 8
      assert.is(seen.seals, 1 | 2 | 4 | 8, `segment ${s.segment}'s seals`);
      assert.is(seen.size, s.bytes);
      assert.is(seen.mmapWrite, 'Operation not permitted', 'a writable shared mapping is refused');
      assert.is(seen.write, 'Operation not permitted');
      assert.is(seen.truncate, 'Operation not permitted');
      assert.is(seen.mmapRead, data[s.segment === 0 ? 1 : 64 * KiB + 1]);
    }
    assert.equal(device.exportSegments(), segments, 'a second export describes the same descriptors');
  } finally {
    await device.free();
  }
});

test('a second device adopts the exported descriptors and reads the same bytes; free closes them', async () => {
  const { device, data } = await filledDevice();
  const adopter = new DeviceHandle('host', 1, { uuid: `memfd-adopt-${process.pid}` });
  try {
    const fds = device.exportSegments().map((s) => reopen(s.fd!));
    await adopter.adopt(fds, segmentBytes);
    await device.free(); // the adopter's descriptors keep the memory
    assert.ok((await adopter.read(0, 0, 64 * KiB)).equals(data.subarray(0, 64 * KiB)));
    assert.ok((await adopter.read(1, 0, 12 * KiB)).equals(data.subarray(64 * KiB)));
    assert.equal(adopter.exportSegments().map((s) => s.fd), fds, 'an adopted arena exports the descriptors it took');
    await adopter.free();
    assert.equal(fds.filter(isOpen), [], 'free closed the adopted descriptors');
  } finally {
    await device.free();
    await adopter.free();
  }
});

test('adopt refuses unsealed, short and miscounted descriptors, names the segment, and closes every one', async () => {
  const { device } = await filledDevice();
  const adopter = new DeviceHandle('host', 1, { uuid: `memfd-refuse-${process.pid}` });
  try {
    // Before export the segments are memfds without seals: find them as /proc shows them.
    const unsealed = readdirSync('/proc/self/fd')
      .filter((fd) => { try { return readlinkSync(`/proc/self/fd/${fd}`).startsWith(`/memfd:weightd:memfd-${process.pid}:s`); } catch { return false; } })
      .map((fd) => reopen(Number(fd)));
    assert.is(unsealed.length, 2);
    const before = openFdCount();
    const notSealed = await refusal(adopter.adopt(unsealed, segmentBytes));
    assert.is(notSealed.code, 'E_BAD_SEGMENT_FD');
    assert.match(notSealed.message, /^segment 0 \(fd \d+\) is not sealed against write, shrink and grow/);
    assert.equal(unsealed.filter(isOpen), [], 'both closed, the one never looked at too');
    assert.is(openFdCount(), before - 2);

    const plain = openSync(join(freshTempDir(), 'plain'), 'w');
    const notMemfd = await refusal(adopter.adopt([plain], [4096]));
    assert.match(notMemfd.message, /^segment 0 \(fd \d+\) is not a sealable memfd/);
    assert.not.ok(isOpen(plain));

    const exported = device.exportSegments();
    const short = exported.map((s) => reopen(s.fd!));
    const tooShort = await refusal(adopter.adopt(short, [64 * KiB, 16 * KiB]));
    assert.match(tooShort.message, /^segment 1 \(fd \d+\) holds 12288 bytes, fewer than the 16384 its plan needs/);
    assert.equal(short.filter(isOpen), []);

    const one = [reopen(exported[0]!.fd!)];
    const miscounted = await refusal(adopter.adopt(one, segmentBytes));
    assert.match(miscounted.message, /^adopt got 1 descriptor\(s\) for 2 segment\(s\)/);
    assert.not.ok(isOpen(one[0]!));

    assert.is(openFdCount(), before - 2, 'no descriptor left open by any refusal');
    assert.is((await refusal(adopter.read(0, 0, 1))).code, 'E_OUT_OF_RANGE', 'nothing was adopted');
  } finally {
    await device.free();
    await adopter.free();
  }
});

test('a fill of a sealed arena is refused; a shortfall is refused before anything is created, naming the bytes', async () => {
  const { device } = await filledDevice();
  try {
    device.exportSegments();
    const sealed = await refusal(device.fill([], [], 0, {}));
    assert.is(sealed.code, 'E_SEALED');
  } finally {
    await device.free();
  }
  const huge = new DeviceHandle('host', 2, { uuid: `memfd-huge-${process.pid}` });
  const before = openFdCount();
  const short = await refusal(huge.allocate([2 ** 50, 2 ** 50]));
  assert.is(short.code, 'E_OUT_OF_MEMORY');
  assert.match(short.message, /needs 2251799813685248 bytes \(2097152\.00 GiB\) for 2 segment\(s\) but only \d+ bytes \([\d.]+ GiB\) are free \((MemAvailable|\/sys\/fs\/cgroup\S*)\)/);
  assert.is(openFdCount(), before);
  const info = huge.info();
  assert.ok(info.totalBytes > 0 && info.freeBytes > 0 && info.freeBytes <= info.totalBytes, JSON.stringify(info));
});

/**
 * A python3 process that holds a reference to the first page of the memfd behind `fd` (a splice
 * into a pipe it does not read), as the kernel's compaction holds a page it migrates. Told "go",
 * it lets go 0.3 s later; told "hold", only once its stdin closes.
 */
async function pagePin(fd: number) {
  const script = `
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
r, w = os.pipe()
assert os.splice(fd, w, 4096, offset_src=0) == 4096
print("held", flush=True)
if sys.stdin.readline().strip() == "go":
    time.sleep(0.3)
else:
    sys.stdin.read()
os.read(r, 4096)
`;
  const child = spawn('python3', ['-c', script, `/proc/${process.pid}/fd/${fd}`], { stdio: ['pipe', 'pipe', 'inherit'] });
  const [line] = (await once(child.stdout, 'data')) as [Buffer];
  assert.is(line.toString().trim(), 'held');
  const exited = once(child, 'exit');
  return {
    // Written before the caller's synchronous seal starts, so the pin outlives its first try.
    release: (after: 'go' | 'hold') => child.stdin.write(`${after}\n`),
    async end() {
      child.stdin.end();
      const [code] = await exited;
      assert.is(code, 0);
    },
  };
}

/** The descriptor of an unexported segment, found as the leak checks find it. */
function segmentFd(index: number): number {
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`).startsWith(`/memfd:weightd:memfd-${process.pid}:s${index} `)) return Number(fd);
    } catch {
      // closed meanwhile
    }
  }
  throw new Error(`segment ${index} has no descriptor`);
}

test('export waits out a page another process holds for a moment, then seals', async () => {
  const { device, data } = await filledDevice();
  const pin = await pagePin(segmentFd(0));
  try {
    pin.release('go');
    const segments = device.exportSegments();
    assert.is(probe(segments[0]!.fd!).write, 'Operation not permitted');
    assert.equal(Buffer.from(await device.read(0, 0, 4096)), data.subarray(0, 4096));
  } finally {
    await pin.end();
    await device.free();
  }
});

test('a page held past the wait: export refuses with E_SHM_SEAL, names why, and frees the arena', async () => {
  const { device } = await filledDevice();
  const pin = await pagePin(segmentFd(1));
  try {
    pin.release('hold');
    const err = (() => {
      try {
        device.exportSegments();
      } catch (e) {
        return e as DeviceError;
      }
      return assert.unreachable('exported a segment it could not seal') as never;
    })();
    assert.is(err.code, 'E_SHM_SEAL');
    assert.match(err.message, /segment 1 of device memfd-\d+: Device or resource busy; its pages were still held .* after 5 s/);
    await pin.end();
    assert.equal(weightdMemfds(), [], 'a half-sealed arena is freed, not served');
  } finally {
    await pin.end();
    await device.free();
  }
});

test('an update segment whose page is held for a moment still seals at commit', async () => {
  const fd = await addon().createWritableSegment(8192, 'weightd:update:test:r0:0');
  try {
    writeSync(fd, Buffer.alloc(8192, 7), 0, 8192, 0);
    const pin = await pagePin(fd);
    pin.release('go');
    await addon().sealWritten(fd, 0, 'commit_update');
    await pin.end();
    assert.is(probe(fd).write, 'Operation not permitted');
  } finally {
    addon().closeFd(fd);
  }
});

test.run();
