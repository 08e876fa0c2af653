// The addon under resource limits and hostile arguments: a reader thread that cannot start is a
// named error (it used to be std::terminate, aborting the daemon), a 1,000-file fill runs under
// 256 descriptors, a FIFO among the files fails at once, and indexes past 2^32-1 are refused
// (they used to wrap to 0 and read the wrong file).
import { execFileSync, spawnSync } from 'node:child_process';
import { chownSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DeviceHandle } from '../../src/native/deviceHandle.js';
import { freshTempDir } from '../helpers/paths.js';

const child = fileURLToPath(new URL('./resourceLimitsChild.js', import.meta.url));
// A uid no account uses, so that RLIMIT_NPROC counts only the child's own threads.
const THROWAWAY_UID = 48611;

/** Runs `command ...args <scenario> <dir>` with a fresh directory (owned by `uid`) removed afterwards. */
function run(command: string, args: string[], uid?: number): Record<string, unknown> {
  const dir = mkdtempSync(join(tmpdir(), 'weightd-limits-'));
  try {
    if (uid !== undefined) chownSync(dir, uid, uid);
    const r = spawnSync(command, [...args, dir], { encoding: 'utf8', timeout: 120_000 });
    assert.is(r.status, 0, `${command} ${args.join(' ')} exited ${r.status} (${r.signal ?? 'no signal'}): ${r.stderr}`);
    return JSON.parse(r.stdout.trim().split('\n').pop()!);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('a reader thread that cannot start fails the fill with E_THREAD_CREATE; the device stays usable', () => {
  if (process.getuid?.() !== 0) {
    console.log('  (skipped: needs root to run the child as a throwaway uid)');
    return;
  }
  const out = run('setpriv', [`--reuid=${THROWAWAY_UID}`, `--regid=${THROWAWAY_UID}`, '--clear-groups', process.execPath, child, 'threads'], THROWAWAY_UID);
  assert.match(String(out.readers), /^E_THREAD_CREATE: cannot start reader thread 2 of 8: .*thread limit.*--load-threads/);
  assert.match(String(out.fillThread), /^E_THREAD_CREATE: cannot start the fill thread/);
  assert.is(out.after, 'no error');
  assert.is(out.bytes, '15');
});

test('a fill and a page-cache scan of 1,000 files run with 256 descriptors: files are opened as they are read, a bounded number at once', () => {
  const out = run('prlimit', ['--nofile=256', process.execPath, child, 'files']);
  assert.equal(out, { result: 'no error', last: 999 % 251, residency: 'no error', totalBytes: 1000 * 4096 });
});

test('a FIFO or a character device among the files fails the fill at once with E_FILE_NOT_REGULAR', async () => {
  const dir = freshTempDir();
  const device = new DeviceHandle('host', 0, { uuid: `fifo-${process.pid}` });
  try {
    const pipe = join(dir, 'pipe');
    execFileSync('mkfifo', [pipe]);
    await device.allocate([4096]);
    const op = { file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: 16, srcPitch: 0 };
    for (const [path, type] of [[pipe, 'a FIFO (named pipe)'], ['/dev/zero', 'a character device']] as const) {
      try {
        await device.fill([path], [op], 16, {});
        assert.unreachable(`${path} was read`);
      } catch (err) {
        assert.is((err as { code?: string }).code, 'E_FILE_NOT_REGULAR');
        assert.match((err as Error).message, `${path} is ${type}, not a regular file`);
      }
    }
  } finally {
    await device.free();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('file and segment indexes past 2^32-1 are refused, not wrapped to 0', async () => {
  const dir = freshTempDir();
  const device = new DeviceHandle('host', 0, { uuid: `index-${process.pid}` });
  try {
    const file = join(dir, 'data');
    writeFileSync(file, Buffer.alloc(64, 1));
    await device.allocate([4096]);
    const op = { file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: 16, srcPitch: 0 };
    for (const [field, bad] of [['file', { ...op, file: 2 ** 32 }], ['segment', { ...op, segment: 2 ** 32 }]] as const) {
      try {
        await device.fill([file], [bad], 16, {});
        assert.unreachable(`${field} 2^32 was accepted`);
      } catch (err) {
        assert.match((err as Error).message, `op 0 ${field} index 4294967296 is past 2^32-1`);
      }
    }
    await device.read(2 ** 32, 0, 1).then(
      () => assert.unreachable('segment 2^32 was read'),
      (err: Error) => assert.match(err.message, /segment must be at most 4294967295/),
    );
  } finally {
    await device.free();
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
