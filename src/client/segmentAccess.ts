// Opening a rank's segments in this process, per backend. host: each segment is a sealed memfd
// received from the daemon (get_segment_fds), mapped read-only (the addon checks its seals and
// size), its descriptor closed at once: the mapping keeps the pages. cuda: each segment is one
// legacy CUDA IPC handle, or ("cuda-fd", --cuda-handles fd) one descriptor of VMM memory, also
// from get_segment_fds, opened once per segment, not per tensor, so attach time does not grow
// with the tensor count. The addon is loaded here, on the first mapping, not when the client is
// imported (src/native/addon.ts says why).
import { constants } from 'node:buffer';
import { DeviceError, ProtocolError } from '../errors.js';
import { addon } from '../native/addon.js';
import { CudaIpcSegment, cudaProbe } from '../native/cuda.js';
import type { SegmentRef, StateReply, TensorMeta } from '../wire/protocol.js';
import { tensorArray, type TensorArray } from './tensorViews.js';

const MAX_LENGTH = constants.MAX_LENGTH;

export interface HostTensor {
  dtype: string;
  shape: number[];
  /** host attach: a read-only mapping (writing to it kills the process); copy: owned memory. */
  data: TensorArray;
}

export interface DeviceTensor {
  dtype: string;
  shape: number[];
  bytes: number;
  /** Device address in this process's CUDA context (segment base + offset). */
  pointer: bigint;
}

/** Every tensor and alias name, each mapped through `make` once per real tensor. */
export function byName<T>(state: StateReply, make: (t: TensorMeta) => T): Record<string, T> {
  const out: Record<string, T> = Object.create(null) as Record<string, T>;
  for (const t of state.tensors) out[t.name] = make(t);
  for (const [alias, target] of Object.entries(state.aliases)) {
    const value = out[target];
    if (value === undefined) throw new ProtocolError('E_BAD_MANIFEST', `alias ${alias} names ${target}, which the manifest does not hold`, { alias, target });
    out[alias] = value;
  }
  return out;
}

function segmentOf<T>(opened: T[], t: TensorMeta): T {
  const s = opened[t.segment];
  if (s === undefined) throw new ProtocolError('E_BAD_MANIFEST', `tensor ${t.name} is in segment ${t.segment}, which the manifest does not list`, { tensor: t.name });
  return s;
}

export interface OpenedHost {
  tensors: Record<string, HostTensor>;
  close(): void;
}

/**
 * A mapping is one ArrayBuffer, and this Node's V8 takes no external ArrayBuffer longer than
 * buffer.constants.MAX_LENGTH (4 GiB on Node 20; a larger one aborts the process inside
 * Node-API instead of failing): a rank's segment beyond it is refused here, by name.
 */
function checkMappable(segment: number, bytes: number): void {
  if (bytes > MAX_LENGTH) {
    throw new DeviceError(
      'E_SEGMENT_TOO_LARGE',
      `segment ${segment} holds ${bytes} bytes, more than one ArrayBuffer can in Node ${process.versions.node} (${MAX_LENGTH}); attach from Python (weightd_client), or from a Node whose buffer.constants.MAX_LENGTH is larger`,
      { segment, bytes, maxBytes: MAX_LENGTH },
    );
  }
}

/**
 * Maps every segment from its descriptor in `fds` (segment number -> fd, from segmentFds) and
 * closes every one of those descriptors, whatever happens; `copy` copies each tensor out and
 * unmaps before returning.
 */
export function openHost(state: StateReply, copy: boolean, fds: Map<number, number>): OpenedHost {
  const buffers: ArrayBuffer[] = [];
  const close = () => {
    for (const b of buffers.splice(0)) addon().unmapShared(b);
  };
  try {
    for (const s of [...state.segments].sort((a, b) => a.segment - b.segment)) {
      const fd = fds.get(s.segment);
      if (fd === undefined) throw new ProtocolError('E_BAD_MANIFEST', `the daemon sent no descriptor for segment ${s.segment}`, { segment: s.segment });
      checkMappable(s.segment, s.bytes);
      buffers[s.segment] = addon().mapShared(fd, s.bytes);
    }
    const tensors = byName(state, (t) => {
      const view = tensorArray(t, segmentOf(buffers, t));
      return { dtype: t.dtype, shape: t.shape, data: copy ? view.slice() : view };
    });
    if (copy) close();
    return { tensors, close };
  } catch (err) {
    close();
    throw err;
  } finally {
    for (const fd of fds.values()) addon().closeFd(fd);
  }
}

export interface OpenedCuda {
  tensors: Record<string, DeviceTensor>;
  /** Copies of each tensor's bytes into this process's memory. */
  read(): Promise<Record<string, HostTensor>>;
  close(): void;
}

/** The handle of a segment whose memory is a descriptor, not a string (docs/protocol.md). */
export const CUDA_FD_HANDLE = 'cuda-fd';

/**
 * Maps "cuda-fd" segments on device `deviceIndex`, `fds[i]` being `segments[i]`'s descriptor; an
 * array indexed by segment number. The fds stay the caller's (close them once this returns: the
 * mappings hold the memory). On a failure every segment already mapped is unmapped again.
 */
export function openFdSegments(fds: readonly number[], segments: readonly SegmentRef[], deviceIndex: number): CudaIpcSegment[] {
  if (fds.length !== segments.length) {
    throw new ProtocolError('E_BAD_MANIFEST', `${fds.length} descriptor(s) came for ${segments.length} cuda-fd segment(s); the daemon must send one per segment`, { fds: fds.length, segments: segments.length });
  }
  const opened: CudaIpcSegment[] = [];
  try {
    segments.forEach((s, i) => (opened[s.segment] = CudaIpcSegment.openFd(deviceIndex, fds[i]!, s.bytes)));
    return opened;
  } catch (err) {
    for (const s of opened) s?.close();
    throw err;
  }
}

/** The "cuda-fd" segments of `state` with their descriptors from `fds` (get_segment_fds' reply). */
function fdSegments(state: StateReply, fds: Map<number, number> | undefined): { refs: SegmentRef[]; fds: number[] } {
  const refs = state.segments.filter((s) => s.handle === CUDA_FD_HANDLE);
  if (refs.length === 0) return { refs, fds: [] };
  if (!fds) {
    throw new ProtocolError('E_NO_SEGMENT_FDS', `rank ${state.rank.globalRank} serves ${refs.length} cuda-fd segment(s), whose descriptors come from get_segment_fds; pass them to openCuda`, { segments: refs.length });
  }
  return {
    refs,
    fds: refs.map((s) => {
      const fd = fds.get(s.segment);
      if (fd === undefined) throw new ProtocolError('E_BAD_MANIFEST', `the daemon sent no descriptor for cuda-fd segment ${s.segment}`, { segment: s.segment });
      return fd;
    }),
  };
}

/**
 * Opens every segment on this process's device `deviceIndex` (its UUID checked): legacy IPC
 * handles from the state itself, "cuda-fd" segments from `fds` (segment number -> fd, from
 * segmentFds), every one of which is closed, whatever happens, as openHost does.
 */
export async function openCuda(state: StateReply, deviceIndex: number, fds?: Map<number, number>): Promise<OpenedCuda> {
  try {
    return await openCudaSegments(state, deviceIndex, fds);
  } finally {
    for (const fd of fds?.values() ?? []) addon().closeFd(fd);
  }
}

async function openCudaSegments(state: StateReply, deviceIndex: number, fds: Map<number, number> | undefined): Promise<OpenedCuda> {
  const probe = await cudaProbe();
  const mine = probe.devices.find((d) => d.index === deviceIndex);
  if (!mine) {
    throw new DeviceError('E_NO_DEVICE', `CUDA device ${deviceIndex} is not visible to this process (${probe.available ? `${probe.devices.length} visible` : probe.reason}); pass the index of your device`, { deviceIndex });
  }
  if (mine.uuid !== state.device.uuid) {
    throw new DeviceError(
      'E_DEVICE_MISMATCH',
      `CUDA device ${deviceIndex} of this process is ${mine.uuid}, but the daemon serves rank ${state.rank.globalRank} from ${state.device.uuid}; ` +
        'attach to the socket of your own device (or fix CUDA_VISIBLE_DEVICES)',
      { deviceIndex, uuid: mine.uuid, daemonUuid: state.device.uuid },
    );
  }
  const segments: CudaIpcSegment[] = [];
  const close = () => {
    for (const s of segments.splice(0)) s?.close();
  };
  try {
    const received = fdSegments(state, fds);
    openFdSegments(received.fds, received.refs, deviceIndex).forEach((s, n) => (segments[n] = s));
    for (const s of state.segments) if (s.handle !== CUDA_FD_HANDLE) segments[s.segment] = CudaIpcSegment.open(deviceIndex, s.handle);
    return {
      tensors: byName(state, (t) => ({ dtype: t.dtype, shape: t.shape, bytes: t.bytes, pointer: segmentOf(segments, t).pointer + BigInt(t.offset) })),
      read: async () => {
        // Each real tensor once (aliases share it), one after another; a fresh, exactly sized
        // ArrayBuffer each (Buffers may share a pool and start unaligned).
        const owned = new Map<string, ArrayBuffer>();
        for (const t of state.tensors) owned.set(t.name, await segmentOf(segments, t).read(t.offset, t.bytes));
        return byName(state, (t) => ({ dtype: t.dtype, shape: t.shape, data: tensorArray({ ...t, offset: 0 }, owned.get(t.name)!) }));
      },
      close,
    };
  } catch (err) {
    close();
    throw err;
  }
}
