// The body of one rank actor: a worker thread that owns one device through the addon for its
// whole life. The device's memory is freed when this thread releases it or ends, even when it
// is terminated (the addon frees it at environment teardown).
import { parentPort, workerData } from 'node:worker_threads';
import { serializeError } from '../errors.js';
import { DeviceHandle } from '../native/deviceHandle.js';
import type { FaultPhase, MainToRank, RankToMain, RankWorkerData } from './rankMessages.js';

const data = workerData as RankWorkerData;
const port = parentPort!;
const post = (m: RankToMain) => port.postMessage(m);
let device: DeviceHandle | undefined;
/** Set once the supervisor asked this rank to stop: a fill cut short then is not a failure. */
let stopping = false;

/** Applies an injected fault for `phase`, if one was asked for (tests only). */
async function injectFault(phase: FaultPhase): Promise<void> {
  const f = data.fault;
  if (!f || f.localRank !== data.localRank || f.phase !== phase) return;
  if (f.kind === 'exit') process.exit(7);
  if (f.kind === 'throw') {
    // Thrown outside any try, so it reaches the Worker's 'error' event like a real bug would.
    setImmediate(() => {
      throw new Error(`injected fault in rank ${data.localRank} at ${phase}`);
    });
    // And the rank goes no further, as after a real throw here: were it to go on loading, a
    // fast rank could report LOADED before its error, and the node be ready for a moment.
    return new Promise<never>(() => {});
  }
  switch (phase) {
    case 'open':
      device = new DeviceHandle('no-such-backend' as never, data.device.index);
      break;
    case 'allocate':
      await new DeviceHandle('host', data.device.index, { shmDir: '/nonexistent-weightd-dir' }).allocate([4096]);
      break;
    case 'fill':
      data.plan = { ...data.plan, files: data.plan.files.map((f) => `${f}.missing`) };
      break;
    case 'export':
    case 'serve':
      await device?.release();
      device?.exportSegments();
      break;
  }
}

async function load(): Promise<void> {
  const { plan } = data;
  await injectFault('open');
  device = new DeviceHandle(data.device.backend, data.device.index, { uuid: data.device.uuid, shmDir: data.shmDir });
  const info = device.info();
  post({ type: 'DEVICE', info });

  await injectFault('allocate');
  // Each backend checks its free memory before allocating and names the shortfall.
  await device.allocate(plan.segments);

  await injectFault('fill');
  // Read from data again: a 'device' fault at 'fill' points the plan at missing files.
  const result = await device.fill(data.plan.files, plan.ops, plan.totalBytes, { ...data.fill, zeroRanges: plan.zeroRanges }, (p) =>
    post({ type: 'PROGRESS', ...p }),
  );

  await injectFault('export');
  const segments = device.exportSegments();
  post({ type: 'LOADED', info: device.info(), segments, bytes: result.bytes, seconds: result.seconds });
  await injectFault('serve');
}

port.on('message', async (m: MainToRank) => {
  if (m.type === 'RELEASE' || m.type === 'STOP') {
    stopping = m.type === 'STOP';
    device?.cancelFill();
    try {
      await device?.release();
      if (m.type === 'RELEASE') post({ type: 'RELEASED' });
    } catch (err) {
      post({ type: 'FAILED', error: serializeError(err) });
    }
    if (m.type === 'STOP') port.close(); // nothing else keeps this thread alive: it ends, and the actor sees exit 0
  }
});

load().catch(async (err: unknown) => {
  try {
    await device?.release();
  } finally {
    if (!stopping) post({ type: 'FAILED', error: serializeError(err) });
  }
});
