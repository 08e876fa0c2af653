// Child process of resourceLimits.test.ts: fills a host device under a resource limit and prints
// one JSON line with what happened. `threads` runs as a throwaway uid (setpriv) whose RLIMIT_NPROC is
// set to the threads it has; `files` runs under a low RLIMIT_NOFILE (prlimit).
import { spawn } from 'node:child_process';
import { strict as assert } from 'node:assert';
import { createInterface } from 'node:readline';
import { readFileSync, writeFileSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { CopyOp } from '../../src/checkpoint/types.js';
import { addon } from '../../src/native/addon.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';

async function outcome(fn: () => unknown): Promise<string> {
  try {
    await fn();
    return 'no error';
  } catch (err) {
    return `${(err as { code?: string }).code}: ${(err as Error).message}`;
  }
}

/** `count` files of `bytes` each, and one op per file copying it whole, back to back. */
function fixture(dir: string, count: number, bytes: number): { paths: string[]; ops: CopyOp[]; total: number } {
  const paths: string[] = [];
  const ops: CopyOp[] = [];
  for (let i = 0; i < count; i++) {
    const p = join(dir, `f${i}.bin`);
    writeFileSync(p, Buffer.alloc(bytes, i % 251));
    paths.push(p);
    ops.push({ file: i, segment: 0, srcOffset: 0, dstOffset: i * bytes, rows: 1, rowBytes: bytes, srcPitch: 0 });
  }
  return { paths, ops, total: count * bytes };
}

const threadsNow = () => Number(/^Threads:\s+(\d+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))![1]);
// RLIMIT_NPROC counts every thread of the uid, and at the limit this process could not fork a
// prlimit to lift it again: a helper started beforehand (one more process of the uid) sets it
// with the prlimit(2) call itself, on request, soft limit only (no privilege needed).
const helper = spawn('python3', ['-u', '-c', [
  'import resource, sys',
  'for line in sys.stdin:',
  '    pid, soft = line.split()',
  '    hard = resource.prlimit(int(pid), resource.RLIMIT_NPROC)[1]',
  '    resource.prlimit(int(pid), resource.RLIMIT_NPROC, (hard if soft == "restore" else int(soft), hard))',
  '    print("ok", flush=True)',
].join('\n')], { stdio: ['pipe', 'pipe', 'inherit'] });
const answers = createInterface({ input: helper.stdout! })[Symbol.asyncIterator]();
/** Sets the soft limit to this process's threads plus the helper plus `room`. */
async function limitThreads(room: number | 'restore'): Promise<void> {
  helper.stdin!.write(`${process.pid} ${room === 'restore' ? room : threadsNow() + 1 + room}\n`);
  assert.equal((await answers.next()).value, 'ok');
}

const scenarios: Record<string, (dir: string) => Promise<unknown>> = {
  async threads(dir) {
    const { paths, ops, total } = fixture(dir, 16, 64 << 10);
    const device = new DeviceHandle('host', 0, { uuid: `limits-${process.pid}` });
    await device.allocate([total]);
    // libuv starts its thread pool on first use: it must exist before the limit, or Node aborts.
    await stat(dir);
    const out: Record<string, string> = {};
    // Room for the fill's own thread, none for a second reader.
    await limitThreads(1);
    out.readers = await outcome(() => device.fill(paths, ops, total, { threads: 8, chunkBytes: 64 << 10 }));
    await limitThreads(0);
    out.fillThread = await outcome(() => device.fill(paths, ops, total, { threads: 8, chunkBytes: 64 << 10 }));
    await limitThreads('restore');
    out.after = await outcome(() => device.fill(paths, ops, total, { threads: 8, chunkBytes: 64 << 10 }));
    out.bytes = String((await device.read(0, 15 << 16, 1))[0]);
    await device.free();
    return out;
  },
  async files(dir) {
    const { paths, ops, total } = fixture(dir, 1000, 4096);
    const device = new DeviceHandle('host', 0, { uuid: `limits-${process.pid}` });
    await device.allocate([total]);
    const result = await outcome(() => device.fill(paths, ops, total, { threads: 4 }));
    const last = (await device.read(0, 999 * 4096, 1))[0];
    await device.free();
    const residency = await outcome(() => addon().pageCacheResidency(paths));
    return { result, last, residency, totalBytes: (await addon().pageCacheResidency(paths)).totalBytes };
  },
};

// The parent made `dir` and removes it, even when this process dies.
try {
  console.log(JSON.stringify(await scenarios[process.argv[2]!]!(process.argv[3]!)));
} finally {
  helper.stdin!.end();
}
