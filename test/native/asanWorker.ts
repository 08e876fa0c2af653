// asanScenario.ts's worker thread: opens a host device, starts a long fill and says so; the
// scenario then terminates the thread, so the addon instance's teardown must cancel the fill,
// join its threads and free the arena.
import './asanAddon.js';
import { parentPort, workerData } from 'node:worker_threads';
import type { CopyOp } from '../../src/checkpoint/types.js';
import { DeviceHandle } from '../../src/native/deviceHandle.js';

const { op, file } = workerData as { op: CopyOp; file: string };
const device = new DeviceHandle('host', 2, { uuid: `asan-worker-${process.pid}` });
await device.allocate([op.rowBytes]);
// The thread is terminated while this runs (or, on a fast machine, just after it ended).
void device.fill([file], [op], op.rowBytes, { threads: 1, chunkBytes: 64 * 1024 }).catch(() => {});
parentPort!.postMessage('filling');
