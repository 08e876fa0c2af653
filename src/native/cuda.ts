// The CUDA side of src/native: which GPUs this process sees, and the client half of CUDA IPC
// (open a daemon's exported segment, by legacy IPC handle or "cuda-fd" descriptor, read bytes
// back, close it). Device filling goes through
// DeviceHandle like every backend.
import { DeviceError } from '../errors.js';
import { addon, type CudaProbe, type DeviceSlot } from './addon.js';
import { hotFillStagingBytes } from './fillPolicy.js';
import { readInChunks } from './readInChunks.js';

/**
 * What CUDA offers this process: never rejects; `available` is false, with the reason, on a
 * machine without the NVIDIA driver or without a visible GPU. Creates no CUDA context; the
 * first call runs cuInit, on a libuv thread.
 */
export function cudaProbe(): Promise<CudaProbe> {
  return addon().cudaProbe();
}

/**
 * Starts CUDA's start-up work on another thread and returns at once: the driver's initialisation
 * (cuInit), then the primary contexts of GPUs 0..devices-1, which the ranks' devices then find
 * made, then the pinned staging of a hot fill of that many GPUs (native/cuda_warmup.h, pinned_stash.h),
 * which the first fill takes, then each context's digest kernels (native/cuda_digest_kernels.h). Never rejects: cudaProbe() and the devices report failures.
 * Call endCudaWarmup() once the ranks hold their own contexts, or have failed.
 */
export function warmCuda(devices: number): Promise<void> {
  return addon().warmCuda(devices, hotFillStagingBytes(devices));
}

/** Drops warmCuda's context references (and any it takes later), and frees the staging no fill took. */
export function endCudaWarmup(): void {
  addon().endCudaWarmup();
}

/**
 * One slot per GPU this process sees, in CUDA ordinal order (CUDA_VISIBLE_DEVICES applies), each
 * named by its nvidia-smi UUID. Empty when CUDA is unavailable; cudaProbe() says why.
 * Passing the slot's uuid to DeviceHandle makes the device check it is still that GPU.
 */
export function cudaDevices(probe: CudaProbe): DeviceSlot[] {
  return probe.devices.map((d) => ({ backend: 'cuda', index: d.index, uuid: d.uuid }));
}

/**
 * A segment another process exported (SegmentExport.handle of a cuda device), mapped into this
 * process. The driver refuses to open a handle in the process that exported it.
 */
export class CudaIpcSegment {
  readonly deviceIndex: number;
  readonly pointer: bigint;
  /** Size of the exporter's allocation. */
  readonly bytes: number;
  #open = true;
  /** Reads under way: close() waits for them (the driver's unmap would pull the memory from under their copy). */
  #reading = 0;

  private constructor(deviceIndex: number, pointer: bigint, bytes: number) {
    this.deviceIndex = deviceIndex;
    this.pointer = pointer;
    this.bytes = bytes;
  }

  static open(deviceIndex: number, handle: string): CudaIpcSegment {
    const m = addon().cudaOpenIpc(deviceIndex, handle);
    return new CudaIpcSegment(deviceIndex, m.pointer, m.bytes);
  }

  /**
   * A "cuda-fd" segment: the VMM memory behind `fd` (from get_segment_fds), `bytes` of it, mapped
   * (cuMemImportFromShareableHandle, reserve, map, set access). `fd` stays the caller's to close;
   * the mapping holds the memory without it. Unlike legacy IPC, a process may map its own.
   */
  static openFd(deviceIndex: number, fd: number, bytes: number): CudaIpcSegment {
    const m = addon().cudaOpenFd(deviceIndex, fd, bytes);
    return new CudaIpcSegment(deviceIndex, m.pointer, m.bytes);
  }

  /**
   * Copies `length` bytes at `offset` of the segment into a new, exactly sized ArrayBuffer (any
   * size), off the JS thread. A read under way when close() is called still lands.
   */
  async read(offset: number, length: number): Promise<ArrayBuffer> {
    if (!this.#open) throw new DeviceError('E_NOT_OPEN', `CUDA IPC segment 0x${this.pointer.toString(16)} of device ${this.deviceIndex} is closed; open it again to read it`);
    this.#reading += 1;
    try {
      return await readInChunks(length, (at, view) => addon().cudaReadDevice(this.deviceIndex, this.pointer, offset + at, view));
    } finally {
      // The last read after a close() unmaps; an unmap failure then fails that read.
      if (--this.#reading === 0 && !this.#open) addon().cudaCloseIpc(this.pointer);
    }
  }

  /** Unmaps the segment, once the reads under way have landed. Safe to call more than once. */
  close(): void {
    if (!this.#open) return;
    this.#open = false;
    if (this.#reading === 0) addon().cudaCloseIpc(this.pointer);
  }
}
