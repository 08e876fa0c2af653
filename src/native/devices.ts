// Which devices this node has, per backend. For host, ids come from WEIGHTD_HOST_DEVICES (a
// comma-separated list, the host backend's CUDA_VISIBLE_DEVICES) so several simulated nodes on
// one machine can have distinct, or on purpose equal, device ids.
import { hostname } from 'node:os';
import { DeviceError } from '../errors.js';
import { addon, type Backend, type CudaHandles, type DeviceSlot } from './addon.js';
import { cudaDevices, cudaProbe } from './cuda.js';
import type { CudaProbe } from './addon.js';

export type { DeviceSlot } from './addon.js';

export const HOST_DEVICES_ENV = 'WEIGHTD_HOST_DEVICES';

/**
 * Host devices visible to this node: the listed ids when the variable is set (their count is
 * the visible device count), else one per local rank named after the host.
 */
export function hostDevices(wanted: number, env: NodeJS.ProcessEnv = process.env): DeviceSlot[] {
  const listed = env[HOST_DEVICES_ENV]?.split(',').map((s) => s.trim()).filter(Boolean);
  const ids = listed ?? Array.from({ length: wanted }, (_, i) => `host-${hostname()}-${i}`);
  return ids.map((uuid, index) => ({ backend: 'host', index, uuid }));
}

/**
 * The devices of this node's local ranks for the chosen backend. `auto` takes CUDA when a
 * driver and enough GPUs are present, else the host backend, and says which in the log.
 */
export async function localDevices(
  config: { device: 'auto' | 'cuda' | 'host'; localWorldSize: number; cudaHandles?: CudaHandles },
  log: { info: (o: object, msg: string) => void },
): Promise<{ devices: DeviceSlot[]; visible: number }> {
  if (config.device !== 'host') {
    const probe = await cudaProbe();
    if (probe.available && probe.devices.length > 0) {
      const devices = cudaDevices(probe);
      log.info({ backend: 'cuda', driverVersion: probe.driverVersion, cudaHandles: config.cudaHandles ?? 'ipc', gpus: probe.devices.map((d) => ({ uuid: d.uuid, name: d.name, totalBytes: d.totalBytes, freeBytes: d.freeBytes })) }, 'CUDA devices');
      const mine = firstDevices(devices, config.localWorldSize, 'cuda');
      if (config.cudaHandles === 'fd') checkFdHandles(probe, mine);
      return { devices: mine, visible: devices.length };
    }
    if (config.device === 'cuda') {
      throw new DeviceError('E_NO_CUDA', `--device cuda: ${probe.reason}`, { reason: probe.reason });
    }
    log.info({ backend: 'host', reason: probe.reason }, 'no CUDA device: using the host backend');
  }
  const devices = hostDevices(config.localWorldSize);
  return { devices: firstDevices(devices, config.localWorldSize, 'host'), visible: devices.length };
}

/** --cuda-handles fd on GPUs that cannot export VMM memory as descriptors fails now, in milliseconds, not at allocation. */
function checkFdHandles(probe: CudaProbe, mine: DeviceSlot[]): void {
  for (const slot of mine) {
    const why = probe.devices.find((d) => d.index === slot.index)?.fdHandlesUnsupported;
    if (why !== undefined) {
      throw new DeviceError('E_CUDA_HANDLES_UNSUPPORTED', `--cuda-handles fd: GPU ${slot.index} (${slot.uuid}): ${why}; use --cuda-handles ipc (its shards cannot then be kept)`, { device: slot.uuid, reason: why });
    }
  }
}

/** The first `wanted` visible devices, as engines assign local ranks to devices. */
function firstDevices(devices: DeviceSlot[], wanted: number, backend: Backend): DeviceSlot[] {
  if (devices.length < wanted) {
    throw new DeviceError(
      'E_DEVICE_COUNT',
      `this node sees ${devices.length} ${backend} device(s) but runs ${wanted} local rank(s) (tensor-parallel-size / nnodes); ` +
        `make ${wanted} devices visible (CUDA_VISIBLE_DEVICES or ${HOST_DEVICES_ENV}) or change --tensor-parallel-size/--nnodes`,
      { visible: devices.length, wanted },
    );
  }
  return devices.slice(0, wanted);
}

/** Share (0 to 1) of these files' bytes the page cache holds now, from a sample (native/page_cache.h); 1 when they have none. */
export async function cachedShare(paths: readonly string[]): Promise<number> {
  const { residentBytes, sampledBytes } = await addon().pageCacheResidency([...paths]);
  return sampledBytes === 0 ? 1 : residentBytes / sampledBytes;
}
