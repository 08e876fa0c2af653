import { setTimeout as sleep } from 'node:timers/promises';
import type { CopyOp, ZeroRange } from '../checkpoint/types.js';
import { addon, asDeviceError, type Backend, type DeviceInfo, type FillOptions, type NativeDevice, type SegmentExport } from './addon.js';
import { fillSizing } from './fillPolicy.js';
import { packCopyOps, packZeroRanges } from './fillRecords.js';
import { readInChunks } from './readInChunks.js';

export interface FillProgress {
  bytes: number;
  totalBytes: number;
  seconds: number;
  /** Joined its group and waiting for the other GPUs' fills to join (FillOptions.group). */
  waitingForGroup: boolean;
}

export interface FillResult {
  bytes: number;
  seconds: number;
}

/** How often a running fill is polled (see native/fill_job.h for why it is polled). */
const POLL_MS = 20;

/** What a fill writes besides its copies. */
export interface FillExtras {
  /** Bytes no op writes that must read as zero afterwards (RankPlan.zeroRanges). */
  zeroRanges?: readonly ZeroRange[];
}

/**
 * One device owned by one rank actor: an arena of segments, filled from checkpoint files and
 * exported to clients. Every method turns native failures into DeviceError.
 */
export class DeviceHandle {
  readonly #native: NativeDevice;
  #released = false;

  constructor(backend: Backend, index: number, options: { uuid?: string; shmDir?: string } = {}) {
    try {
      this.#native = new addon.Device(backend, index, options);
    } catch (err) {
      throw asDeviceError(err);
    }
  }

  info(): DeviceInfo {
    return this.#call(() => this.#native.info());
  }

  allocate(segmentBytes: number[]): void {
    this.#call(() => this.#native.allocate(segmentBytes));
  }

  async fill(
    files: string[],
    ops: readonly CopyOp[],
    totalBytes: number,
    options: FillOptions & FillExtras,
    onProgress?: (p: FillProgress) => void,
  ): Promise<FillResult> {
    const { zeroRanges = [], ...chosen } = options;
    this.#call(() => this.#native.startFill(files, packCopyOps(ops), packZeroRanges(zeroRanges), fillSizing(chosen)));
    for (;;) {
      const s = this.#native.fillStatus();
      onProgress?.({ bytes: s.bytes, totalBytes, seconds: s.seconds, waitingForGroup: s.waitingForGroup });
      if (s.error) throw asDeviceError(s.error);
      if (s.done) return { bytes: s.bytes, seconds: s.seconds };
      await sleep(POLL_MS);
    }
  }

  cancelFill(): void {
    this.#native.cancelFill();
  }

  exportSegments(): SegmentExport[] {
    return this.#call(() => this.#native.exportSegments());
  }

  read(segment: number, offset: number, length: number): Buffer {
    return Buffer.from(this.#call(() => readInChunks(length, (at, view) => this.#native.read(segment, offset + at, view))));
  }

  /** Frees the arena (and, for host, removes its files). Safe to call more than once. */
  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.#call(() => this.#native.release());
  }

  #call<T>(fn: () => T): T {
    try {
      return fn();
    } catch (err) {
      throw asDeviceError(err);
    }
  }
}
