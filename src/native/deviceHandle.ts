import { randomUUID } from 'node:crypto';
import { fstatSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import type { CopyOp, TensorRange, ZeroRange } from '../checkpoint/types.js';
import { addon, type Backend, type DeviceInfo, type FillOptions, type NativeDevice, type NativeDeviceOptions, type SegmentExport } from './addon.js';
import { fillSizing } from './fillPolicy.js';
import { packCopyOps, packTensorRanges, packZeroRanges } from './fillRecords.js';
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
  /** Each of FillExtras.tensorRanges' digests, in order (none asked: empty). */
  digests: string[];
  /**
   * Bytes the digests read again at the end of the fill: the pieces no read of it held whole
   * (docs/spec/fingerprint.md §8). 0 when the fill reads every tensor whole, as at tp=1.
   */
  digestRereadBytes: number;
  /**
   * Host, in a digest group (native/host_digest_group.h, RowsPlan): bytes of row-parallel
   * tensors' columns this fill wrote into the other ranks' arenas, and bytes of its own another
   * rank wrote (so it did not read them); absent when 0.
   */
  rowsDeliveredBytes?: number;
  rowsReceivedBytes?: number;
  /** Bytes of digest pieces hashed on the GPU (cuda, native/cuda_digests.h); 0 on the host. */
  digestGpuBytes: number;
  /** Why pieces the GPU could have hashed were hashed on the CPU; absent when none were. */
  digestGpuUnavailable?: string;
  /**
   * Where the GPU hashed: seconds loading the digest kernel and its jobs before the first read,
   * and seconds the fill waited for the kernels after its last copy landed.
   */
  digestGpuSetupSeconds?: number;
  digestGpuTailSeconds?: number;
  /** Seconds making the fill's pinned staging before its first read, and whether the CUDA warm-up had pinned it ahead (native/pinned_stash.h). */
  stagingSeconds?: number;
  stagingPinnedAhead?: boolean;
}

/** How often a running fill is polled while far from its end (native/fill_job.h says why it is polled). */
const POLL_MS = 20;
/** The shortest wait between polls, near a fill's end. */
const MIN_POLL_MS = 1;
/** Before a fill's first byte lands, when nothing tells how long it has left (a small one may end soon). */
const SETUP_POLL_MS = 5;

/**
 * How long to wait before polling a running fill again: POLL_MS while it is far from its end (or
 * waits for its group), then half the time its rate so far says it has left, down to MIN_POLL_MS
 * once its bytes have landed (its digests' last kernels and reads may still run). A fixed POLL_MS
 * saw a fill's end up to 20 ms late, 10 ms on average, on the path from start to READY; the rate so
 * far counts the fill's setup too, so it overstates what is left, and halving the estimate closes
 * in on the end in a few polls.
 */
export function nextPollMs(p: FillProgress): number {
  if (p.waitingForGroup) return POLL_MS;
  if (p.bytes <= 0 || p.seconds <= 0) return SETUP_POLL_MS;
  const leftMs = (Math.max(0, p.totalBytes - p.bytes) * p.seconds * 1000) / p.bytes;
  return Math.min(POLL_MS, Math.max(MIN_POLL_MS, leftMs / 2));
}

/** What a fill writes besides its copies. */
export interface FillExtras {
  /** Bytes no op writes that must read as zero afterwards (RankPlan.zeroRanges). */
  zeroRanges?: readonly ZeroRange[];
  /** Tensors to digest whole (RankPlan.contentTensors.ranges). */
  tensorRanges?: readonly TensorRange[];
}

/**
 * One device owned by one rank actor: an arena of segments, filled from checkpoint files and
 * exported to clients. Native failures arrive as DeviceError. allocate, read and free run
 * off the JS thread, one after another in call order: the addon refuses a call on a device
 * while another runs (E_DEVICE_BUSY), so a free() called during a read waits for the read.
 */
export class DeviceHandle {
  readonly #native: NativeDevice;
  /**
   * cuda-fd: what memory each segment is (SegmentExport.memory), by position, where another
   * version holds it too: a writer's version adopts the segments it shares with its base. Every
   * other segment is an allocation of this handle's own, named by #own and its position.
   */
  #shared: readonly (string | null)[] = [];
  readonly #own = randomUUID();
  /** The last queued job, settled or not; the next one starts when it has settled. */
  #last: Promise<unknown> = Promise.resolve();
  /** Queued jobs not yet settled. */
  #queued = 0;
  #freed: Promise<void> | undefined;

  constructor(backend: Backend, index: number, options: NativeDeviceOptions = {}) {
    this.#native = new (addon().Device)(backend, index, options);
  }

  info(): DeviceInfo {
    return this.#native.info();
  }

  allocate(segmentBytes: number[]): Promise<void> {
    return this.#queue(async () => {
      await this.#native.allocate(segmentBytes);
      this.#shared = [];
    });
  }

  /**
   * Takes another process's exported arena (see NativeDevice.adopt), queued like allocate.
   * `shared`: cuda-fd, per segment, the memory of another version's segment it is (null: its own).
   */
  adopt(fds: number[], segmentBytes: number[], shared: readonly (string | null)[] = []): Promise<void> {
    return this.#queue(async () => {
      await this.#native.adopt(fds, segmentBytes);
      this.#shared = shared;
    });
  }

  /** NativeDevice.checkAdopted, queued like adopt: a free() called meanwhile waits for it. */
  checkAdopted(): Promise<void> {
    return this.#queue(() => this.#native.checkAdopted());
  }

  /** free() was called: what runs after it must not report this device as serving. */
  get freeing(): boolean {
    return this.#freed !== undefined;
  }

  async fill(
    files: string[],
    ops: readonly CopyOp[],
    totalBytes: number,
    options: FillOptions & FillExtras,
    onProgress?: (p: FillProgress) => void,
  ): Promise<FillResult> {
    const { zeroRanges = [], tensorRanges = [], ...chosen } = options;
    // After the calls queued before it (an allocate not awaited), which the addon would refuse to
    // overlap; at once when none is, so a cancelFill() right after fill() finds the fill started.
    if (this.#queued > 0) await this.#last;
    this.#native.startFill(files, packCopyOps(ops), packZeroRanges(zeroRanges), fillSizing(chosen), packTensorRanges(tensorRanges));
    // Progress goes out at most every POLL_MS, and at the end, however often the fill is polled:
    // each report is a message to the main thread.
    let reportedAt = -Infinity;
    for (;;) {
      const s = this.#native.fillStatus();
      const progress = { bytes: s.bytes, totalBytes, seconds: s.seconds, waitingForGroup: s.waitingForGroup };
      if (s.done || s.error || (s.seconds - reportedAt) * 1000 >= POLL_MS) {
        reportedAt = s.seconds;
        onProgress?.(progress);
      }
      if (s.error) throw s.error;
      if (s.done) {
        return {
          bytes: s.bytes, seconds: s.seconds, digests: s.digests ?? [], digestRereadBytes: s.digestRereadBytes ?? 0,
          digestGpuBytes: s.digestGpuBytes ?? 0, ...(s.digestGpuUnavailable ? { digestGpuUnavailable: s.digestGpuUnavailable } : {}),
          ...(s.digestGpuSetupSeconds !== undefined ? { digestGpuSetupSeconds: s.digestGpuSetupSeconds, digestGpuTailSeconds: s.digestGpuTailSeconds } : {}),
          ...(s.stagingSeconds !== undefined ? { stagingSeconds: s.stagingSeconds, stagingPinnedAhead: s.stagingPinnedAhead } : {}),
          ...(s.rowsDeliveredBytes ? { rowsDeliveredBytes: s.rowsDeliveredBytes } : {}),
          ...(s.rowsReceivedBytes ? { rowsReceivedBytes: s.rowsReceivedBytes } : {}),
        };
      }
      await sleep(nextPollMs(progress));
    }
  }

  cancelFill(): void {
    this.#native.cancelFill();
  }

  exportSegments(): SegmentExport[] {
    // Every memfd lies on the kernel's one internal mount: its inode names it. A cuda-fd
    // segment's descriptor is an anonymous inode that all of them share, naming nothing: the
    // handle names its memory itself (#shared, #own).
    return this.#native.exportSegments().map((s, i) => {
      if (s.handle === 'memfd' && s.fd !== undefined) return { ...s, memory: `memfd:${fstatSync(s.fd).ino}` };
      if (s.handle === 'cuda-fd') return { ...s, memory: this.#shared[i] ?? `cuda:${this.#own}:${i}` };
      return s;
    });
  }

  async read(segment: number, offset: number, length: number): Promise<Buffer> {
    return Buffer.from(await this.#queue(() => readInChunks(length, (at, view) => this.#native.read(segment, offset + at, view))));
  }

  /** Cancels a running fill and frees the arena (and, for host, closes its memfds). Every call after the first returns the first's promise. */
  free(): Promise<void> {
    this.#freed ??= this.#queue(() => this.#native.free());
    return this.#freed;
  }

  #queue<T>(job: () => Promise<T>): Promise<T> {
    this.#queued++;
    const next = this.#last.then(job, job);
    this.#last = next.catch(() => undefined).finally(() => this.#queued--);
    return next;
  }
}
