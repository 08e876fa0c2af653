// One worker thread per GPU, each holding a DeviceHandle with its rank's arena, the way the
// daemon's rank actors do: fills on several GPUs run at once in one process. The main thread
// sends every worker the same request and waits for all the replies.
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { closeSync, openSync, readFileSync, readSync, writeFileSync } from 'node:fs';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';

const ROLE = 'weightd-gpu-fleet-worker';

if (!isMainThread && workerData?.role === ROLE) {
  const { DeviceHandle } = await import('../../dist/src/native/deviceHandle.js');
  const { index, plan, expectedPath } = workerData;
  const started = performance.now();
  const device = new DeviceHandle('cuda', index);
  await device.allocate([plan.segmentBytes]);
  const openSeconds = (performance.now() - started) / 1000;

  const handlers = {
    info: () => ({ ...device.info(), openSeconds }),
    // `digest: true` digests every tensor as the daemon's fills do (docs/spec/fingerprint.md §8);
    // without it the fill hashes nothing, as before digests existed.
    fill: ({ options: { digest, ...options } }) => device.fill(plan.files, plan.ops, plan.payloadBytes, digest ? { ...options, tensorRanges: plan.tensorRanges } : options),
    export: () => device.exportSegments(),
    // Compares every tensor of the arena with the file an independent slicer (numpy) wrote, laid
    // out at the same offsets. Names the first tensors that differ and where.
    verify: async () => {
      const fd = openSync(expectedPath, 'r');
      try {
        const bad = [];
        let checkedBytes = 0;
        for (const t of plan.tensors) {
          const want = Buffer.allocUnsafe(t.bytes);
          if (readSync(fd, want, 0, t.bytes, t.offset) !== t.bytes) throw new Error(`${expectedPath} is short at ${t.name}`);
          const got = await device.read(0, t.offset, t.bytes);
          if (!got.equals(want)) {
            let at = 0;
            while (got[at] === want[at]) at++;
            bad.push({ name: t.name, dim: t.dim, firstDifferentByte: at });
          }
          checkedBytes += t.bytes;
        }
        return { tensors: plan.tensors.length, checkedBytes, mismatched: bad.length, firstMismatches: bad.slice(0, 5) };
      } finally {
        closeSync(fd);
      }
    },
    close: () => device.free(),
  };

  parentPort.on('message', async ({ id, op, args }) => {
    try {
      parentPort.postMessage({ id, ok: true, result: await handlers[op](args ?? {}) });
    } catch (err) {
      parentPort.postMessage({ id, ok: false, error: { code: err.code, message: err.message } });
    }
  });
  parentPort.postMessage({ ready: true });
}

/** Drops the page cache (root only) so the next read comes from the disk. */
export function dropCaches() {
  execFileSync('sync');
  writeFileSync('/proc/sys/vm/drop_caches', '3');
}

export class GpuFleet {
  #workers;
  #nextId = 0;

  constructor(workers) {
    this.#workers = workers;
  }

  /**
   * members: [{ index, plan, expectedPath? }] (expectedPath: what 'verify' compares with).
   * Resolves once every device holds its allocated arena.
   */
  static async open(members) {
    const workers = await Promise.all(members.map(({ index, plan, expectedPath }) => new Promise((resolve, reject) => {
      const w = new Worker(new URL(import.meta.url), { workerData: { role: ROLE, index, plan, expectedPath } });
      w.once('error', reject);
      w.once('message', (m) => (m.ready ? resolve(w) : reject(new Error(`unexpected ${JSON.stringify(m)}`))));
    })));
    return new GpuFleet(workers);
  }

  #ask(w, op, args) {
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      const onMessage = (m) => {
        if (m.id !== id) return;
        w.off('message', onMessage);
        if (m.ok) resolve(m.result);
        else reject(Object.assign(new Error(m.error.message), { code: m.error.code }));
      };
      w.on('message', onMessage);
      w.postMessage({ id, op, args });
    });
  }

  /** The same request to every device at once; per-device results in member order. */
  all(op, args) {
    return Promise.all(this.#workers.map((w) => this.#ask(w, op, args)));
  }

  /**
   * Fills every device at once; `wall` runs from the first request to the last reply. With
   * `group: true` the devices fill as one group (one pass over the files), as the daemon's
   * ranks on one node do.
   */
  async fill(options) {
    const t0 = performance.now();
    const group = options.group === true ? { id: randomUUID(), size: this.#workers.length } : undefined;
    const devices = await this.all('fill', { options: group ? { ...options, group } : options });
    return { wall: (performance.now() - t0) / 1000, devices };
  }

  async close() {
    await this.all('close');
    await Promise.all(this.#workers.map((w) => w.terminate()));
  }
}

export function peakRssMiB() {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8'));
  return m ? Math.round(Number(m[1]) / 1024) : null;
}

/**
 * Best and median seconds of a set of reps, each rep timed by its slowest device's native
 * clock: the devices start within a millisecond of each other, and the JS side only learns of
 * the end at its next poll (DeviceHandle.fill: up to 20 ms late before 2026-12-07, about 1 ms since).
 */
export function fillSeconds(runs) {
  const s = runs.map((r) => Math.max(...r.deviceSeconds)).sort((a, b) => a - b);
  return { best: s[0], median: s[Math.floor(s.length / 2)] };
}
