// asanScenario.ts's worker thread: opens a host device, starts a long fill and says so; the
// scenario then terminates the thread, so the addon instance's teardown must cancel the fill,
// join its threads and free the arena.
import './asanAddon.js';
import { parentPort, workerData } from 'node:worker_threads';
import { DeviceHandle } from '../../src/native/deviceHandle.js';

const { shmDir, file } = workerData as { shmDir: string; file: string };
const bytes = 32 * 2 ** 20;
const device = new DeviceHandle('host', 2, { uuid: `asan-worker-${process.pid}`, shmDir });
await device.allocate([bytes]);
// The thread is terminated while this runs (or, on a fast machine, just after it ended).
void device.fill([file], [{ file: 0, segment: 0, srcOffset: 0, dstOffset: 0, rows: 1, rowBytes: bytes, srcPitch: 0 }], bytes, { threads: 1, chunkBytes: 64 * 1024 }).catch(() => {});
parentPort!.postMessage('filling');
