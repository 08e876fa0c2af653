// Opening a rank's segments in this process, per backend. host: each segment is a shared-memory
// file, mapped read-only (the addon checks it belongs to this user). cuda: each segment is one
// legacy CUDA IPC handle, or ("cuda-fd", --cuda-handles fd) one descriptor of VMM memory the
// daemon sends over the socket (get_segment_fds), opened once per segment, not per tensor, so
// attach time does not grow with the tensor count. The addon is loaded here, on the first mapping, not when the client is
// imported (src/native/addon.ts says why).
import { DeviceError, ProtocolError } from '../errors.js';
import { addon } from '../native/addon.js';
import { CudaIpcSegment, cudaProbe } from '../native/cuda.js';
import type { SegmentRef, StateReply, TensorMeta } from '../serve/protocol.js';
import { tensorArray, type TensorArray } from './tensorViews.js';

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

/** Maps every segment; `copy` copies each tensor out and unmaps before returning. */
export function openHost(state: StateReply, copy: boolean): OpenedHost {
  const buffers: ArrayBuffer[] = [];
  const close = () => {
    for (const b of buffers.splice(0)) addon().unmapShared(b);
  };
  try {
    for (const s of [...state.segments].sort((a, b) => a.segment - b.segment)) buffers[s.segment] = addon().mapShared(s.handle, s.bytes);
    const tensors = byName(state, (t) => {
      const view = tensorArray(t, segmentOf(buffers, t));
      return { dtype: t.dtype, shape: t.shape, data: copy ? view.slice() : view };
    });
    if (copy) close();
    return { tensors, close };
  } catch (err) {
    close();
    throw err;
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

/** What get_segment_fds returns: `fds[i]` is segment `segments[i]`'s descriptor. */
export interface SegmentFds {
  segments: number[];
  fds: number[];
}

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

/** The "cuda-fd" segments of `state` in the order `received` lists them, with their descriptors. */
function fdSegments(state: StateReply, received: SegmentFds | undefined): { refs: SegmentRef[]; fds: number[] } {
  const wanted = state.segments.filter((s) => s.handle === CUDA_FD_HANDLE);
  if (wanted.length === 0) return { refs: [], fds: [] };
  if (!received) {
    throw new ProtocolError('E_NO_SEGMENT_FDS', `rank ${state.rank.globalRank} serves ${wanted.length} cuda-fd segment(s), whose descriptors come from get_segment_fds; pass them to openCuda`, { segments: wanted.length });
  }
  const bySegment = new Map(state.segments.map((s) => [s.segment, s]));
  const refs = received.segments.map((n) => {
    const ref = bySegment.get(n);
    if (ref?.handle !== CUDA_FD_HANDLE) throw new ProtocolError('E_BAD_MANIFEST', `get_segment_fds sent a descriptor for segment ${n}, which is not a cuda-fd segment of this rank`, { segment: n });
    return ref;
  });
  if (new Set(received.segments).size !== wanted.length || refs.length !== wanted.length) {
    throw new ProtocolError('E_BAD_MANIFEST', `get_segment_fds sent segments ${received.segments.join(',')} but the rank has cuda-fd segments ${wanted.map((s) => s.segment).join(',')}`, {});
  }
  return { refs, fds: received.fds };
}

/**
 * Opens every segment on this process's device `deviceIndex` (its UUID checked): legacy IPC
 * handles from the state itself, "cuda-fd" segments from `segmentFds` (get_segment_fds' reply;
 * the caller closes those fds after).
 */
export async function openCuda(state: StateReply, deviceIndex: number, segmentFds?: SegmentFds): Promise<OpenedCuda> {
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
    const { refs, fds } = fdSegments(state, segmentFds);
    openFdSegments(fds, refs, deviceIndex).forEach((s, n) => (segments[n] = s));
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
