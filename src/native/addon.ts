// The only module that loads the compiled addon. Everything above it sees these types, never
// the backend underneath (host shared memory or CUDA).
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { DeviceError, type NativeErrorCode } from '../errors.js';
import type { PackedCommitCopies, PackedCopyOps, PackedTensorRanges, PackedZeroRanges } from './fillRecords.js';

export type Backend = 'host' | 'cuda';

/** A reply with descriptors that met a full socket (fdSendStart); opaque. */
declare const pendingFdSend: unique symbol;
export type PendingFdSend = { readonly [pendingFdSend]: true };

/** One device a rank can open: its backend, ordinal and the uuid DeviceHandle checks it against. */
export interface DeviceSlot {
  backend: Backend;
  index: number;
  uuid: string;
}

export interface DeviceInfo {
  backend: Backend;
  index: number;
  uuid: string;
  name: string;
  /** cuda: the GPU's memory. host: MemTotal, or the memory cgroup's limit when smaller. */
  totalBytes: number;
  /**
   * cuda: free GPU memory (0 from cudaProbe, which has no context). host: what a fill can still take without evicting anything:
   * MemAvailable, bounded by the cgroup's limit less its usage that is not reclaimable page
   * cache (native/host_memory.h). allocate refuses an arena larger than this (E_OUT_OF_MEMORY).
   */
  freeBytes: number;
  /**
   * cuda: false while the device has made no context yet (NativeDeviceOptions.deferContext), so
   * freeBytes (0) is not a measurement: "not probed yet". Absent once measured, and on the host.
   */
  freeProbed?: false;
}

export interface SegmentExport {
  segment: number;
  bytes: number;
  /**
   * host: "memfd" (the segment is `fd`); cuda: the 64-byte legacy IPC handle, base64, or "cuda-fd"
   * (--cuda-handles fd, or an adopted arena: the segment is `fd`, VMM memory; docs/protocol.md).
   */
  handle: string;
  /**
   * The segment's descriptor (host: a memfd sealed read-only; cuda-fd: VMM memory), to pass over
   * SCM_RIGHTS (get_segment_fds). Owned
   * by the device: valid until its free(), never to be closed by anyone else. Absent where the
   * backend has none (cuda legacy IPC).
   */
  fd?: number;
  /**
   * Which memory the segment is, the same for every version that holds it (a writer's partial
   * update shares the base's segments: docs/weight-updates.md), so that memory is counted once
   * (src/models/evictionPolicy.ts), set by DeviceHandle.exportSegments. Host: the memfd's inode;
   * cuda-fd: a name the rank's handle gives its allocation, or the base's for a segment a
   * writer's version shares. Absent where no two versions share memory (cuda legacy IPC).
   */
  memory?: string;
}

/** Content digests of tensors in GPU memory (native/cuda_segment_digests.h): a cuda commit's, or verify's. */
export interface CudaDigested {
  digests: string[];
  /** Where they were hashed: by the fill's digest kernel, or read back and hashed on the CPU. */
  hashedOn: 'gpu' | 'cpu';
  /** Why the digest kernel did not hash them ("" when it did). */
  gpuDigestUnavailable: string;
}

/** Where a cuda commit's time went on its native thread (native/cuda_update_segments.h CudaCommitted), in milliseconds. */
export interface CommitTimings {
  allocateMs: number;
  openMs: number;
  /** Mapping the finals made earlier (a pull's), the shared segments and the base's read for gaps. */
  mapMs: number;
  copyMs: number;
  digestMs: number;
  /** The whole native call: what the caller's wall time adds to it is the thread pool's queue and the hop back to JS. */
  nativeMs: number;
  /** How many allocations it mapped: a full pull's commit maps none (its early copies wrote and digested every final). */
  mapped: number;
}

/** Where a pull's early copies' time went on their native thread (native/cuda_update_segments.h CudaPulled), in milliseconds. */
export interface PullCopyTimings {
  allocateMs: number;
  openMs: number;
  mapMs: number;
  copyMs: number;
  /** Digesting the tensors the pull wrote whole (the commit then neither maps nor hashes them). */
  digestMs: number;
  /** Handing what the call held (the finals it mapped, the writer's memory it opened, the digests' module and buffers, the streams) to the releaser's thread, which lets go of it after the call answered. */
  releaseMs: number;
  nativeMs: number;
  /** The digest kernel's module loaded, its job table and buffers made, and the streams. */
  setupMs: number;
  /** Of setupMs, loading the digest kernel's module. */
  moduleMs: number;
  /** Bytes the GPU digest kernel copied as it hashed them, reading them once (the rest: cuMemcpy). */
  copiedByKernelBytes: number;
}

/** How a cuda device allocates and exports its segments (--cuda-handles; native/cuda_vmm.h). */
export type CudaHandles = 'ipc' | 'fd';
export const CUDA_HANDLES: readonly CudaHandles[] = ['ipc', 'fd'];

/**
 * cuda only. pread: reader threads pread into pinned staging buffers, then copy. register: mmap
 * the files and pin (cuMemHostRegister, read-only) windows of them, so the copy engine reads the
 * page cache directly. See docs/gpu-results.md for which is faster where.
 */
export type FillMode = 'pread' | 'register';

/** What a caller may choose; fillSizing (fillPolicy.ts) decides the rest. */
export interface FillOptions {
  /** Reader threads. */
  threads?: number;
  /** Unit of work given to one reader. */
  chunkBytes?: number;
  /** Bound on pinned staging memory (cuda). */
  stagingBytes?: number;
  /** O_DIRECT reads where the file system allows (cold page cache). */
  direct?: boolean;
  /** cuda only; default 'pread'. */
  mode?: FillMode;
  /**
   * The node's ranks, `size` of them, name the same id. cuda: their fills share one pass over the
   * files; each waits until all have started (native/cuda_fill_group.h). host: each fills alone,
   * but they share the hashing of the content digests; each waits at its end for the others
   * (native/host_digest_group.h). A rank that will not fill leaves (leaveFillGroup).
   */
  group?: { id: string; size: number };
  /**
   * cuda only: where digest pieces are hashed; default 'gpu', where the addon has the kernel
   * (native/cuda_digests.h). 'cpu' hashes them on the reader threads (to compare the two).
   */
  digestOn?: 'gpu' | 'cpu';
}

/** What the addon gets: every sizing number decided (fillSizing), none left to native defaults. */
export interface NativeFillOptions extends FillOptions {
  threads: number;
  chunkBytes: number;
  stagingBytes: number;
  /** cuda: a group's staging stays under max(stagingBytes, this) however many GPUs share it. */
  maxGroupStagingBytes: number;
}

export interface NativeFillStatus {
  done: boolean;
  bytes: number;
  seconds: number;
  /** The fill has joined its group and waits for the other members (FillOptions.group). */
  waitingForGroup: boolean;
  error?: DeviceError;
  /** Once done: each tensor range's digest (docs/spec/fingerprint.md, version 3), in order. */
  digests?: string[];
  /** Once done: bytes of digest pieces no read of the fill held whole, read again at its end. */
  digestRereadBytes?: number;
  /** Once done (host, in a digest group): bytes of row-parallel columns written into the other members' arenas, and of its own another member wrote. */
  rowsDeliveredBytes?: number;
  rowsReceivedBytes?: number;
  /** Once done (cuda): bytes of digest pieces hashed on the GPU. */
  digestGpuBytes?: number;
  /** Once done (cuda): why pieces the GPU could have hashed were hashed on the CPU. */
  digestGpuUnavailable?: string;
  /** Once done (cuda, where the GPU hashed): seconds loading the digest kernel and its jobs, and seconds waited for the kernels after the last copy. */
  digestGpuSetupSeconds?: number;
  digestGpuTailSeconds?: number;
  /** Once done (cuda, read through staging): seconds making the staging before the first read, and whether the CUDA warm-up had pinned it ahead. */
  stagingSeconds?: number;
  stagingPinnedAhead?: boolean;
}

/**
 * One device. The Promise-returning calls run on a libuv thread; while one is in flight every
 * other call but fillStatus and cancelFill throws E_DEVICE_BUSY, so calls on one device must be
 * ordered by the caller (DeviceHandle chains them).
 */
export interface NativeDevice {
  info(): DeviceInfo;
  allocate(segmentBytes: number[]): Promise<void>;
  /**
   * Records packed by fillRecords.ts; every backend writes zeros over `zeroRanges`, and digests
   * each of `tensorRanges` whole (native/content_digests.h), bytes no op copies included.
   */
  startFill(files: string[], ops: PackedCopyOps, zeroRanges: PackedZeroRanges, options: NativeFillOptions, tensorRanges?: PackedTensorRanges): void;
  fillStatus(): NativeFillStatus;
  cancelFill(): void;
  /** Seals the arena (host: read-only memfds) and describes its segments; idempotent. */
  exportSegments(): SegmentExport[];
  /**
   * Takes an arena another process exported instead of allocate + fill: one sealed descriptor
   * per segment, in order. The device owns the fds from the call on (closed by free(), or at once
   * if adopt fails for any reason); fill is refused on an adopted arena.
   */
  adopt(fds: number[], segmentBytes: number[]): Promise<void>;
  /**
   * cuda with a deferred context: imports and maps each adopted descriptor (making the context),
   * the check adopt() makes at once on a device that has one; a failure names the segment and
   * leaves the descriptors held until free(). Resolves at once where nothing is unchecked (host).
   */
  checkAdopted(): Promise<void>;
  /** Fills `dst` from `offset` of the segment. Read through readInChunks. */
  read(segment: number, offset: number, dst: Uint8Array): Promise<void>;
  /** Cancels a running fill (waiting for its threads) and frees the arena. */
  free(): Promise<void>;
}

export interface NativeDeviceOptions {
  /** host: the stable id reported as the device UUID. cuda: the UUID the device must have. */
  uuid?: string;
  /** cuda: 'ipc' (default) or 'fd'; with 'fd' a GPU that cannot export descriptors fails with E_CUDA_HANDLES_UNSUPPORTED. */
  cudaHandles?: CudaHandles;
  /**
   * cuda: retain the GPU's context on the first call that needs one instead of now, so a device
   * that only adopts and exports descriptors makes none; adopt() then holds them unmapped until
   * checkAdopted() (a restart's fast path, src/actors/adoptHere.ts). info() says freeProbed: false
   * until then.
   */
  deferContext?: boolean;
}

export interface PeerCredentials {
  pid: number;
  uid: number;
  gid: number;
}

export interface CudaProbe {
  /** True when libcuda loaded, cuInit succeeded and at least one GPU is visible. */
  available: boolean;
  /** Why not, when not available (e.g. "libcuda.so.1 not found: no NVIDIA driver ..."). */
  reason: string;
  /** The driver's CUDA version, e.g. 13000 for 13.0; absent when libcuda did not load. */
  driverVersion?: number;
  /**
   * Visible GPUs (CUDA_VISIBLE_DEVICES applies). freeBytes is 0: it needs a context.
   * fdHandlesUnsupported: why that GPU cannot serve --cuda-handles fd; absent when it can.
   */
  devices: Array<DeviceInfo & { fdHandlesUnsupported?: string }>;
}

export interface CudaIpcMapping {
  /** Device address of the mapped allocation, in this process. */
  pointer: bigint;
  /** Size of the exporter's allocation. */
  bytes: number;
}

/** One reply frame read by unixRequest, and the descriptors that came with it (the caller's to close). */
export interface UnixReply {
  /** The whole frame, header included. */
  frame: Buffer;
  /** Received with MSG_CMSG_CLOEXEC, in the order they were sent. */
  fds: number[];
}

export interface Addon {
  Device: new (backend: Backend, index: number, options: NativeDeviceOptions) => NativeDevice;
  peerCredentials(fd: number): PeerCredentials;
  /** native/unread_bytes.h: what the peer of Unix stream socket `fd` has not read yet, in the kernel's accounting (0 exactly when it read everything). */
  unreadBytes(fd: number): number;
  /** Maps a received host segment (a memfd sealed against write, shrink and grow, else E_SHM_OPEN) read-only; the caller still closes `fd`. */
  mapShared(fd: number, bytes: number): ArrayBuffer;
  unmapShared(buffer: ArrayBuffer): void;
  /**
   * native/unix_fds.h (FdSend): sends on a connected AF_UNIX stream socket what it takes now of
   * `frame`, with `fds` as SCM_RIGHTS in batches of 250, never waiting. null once every byte
   * went; else the pending rest (owning a duplicate of the socket) for fdSendSome, and the bytes
   * it has left. The caller keeps its fds open until it ends. src/wire/socketFdWriter.ts's
   * sendFds drives both. E_FD_SEND.
   */
  fdSendStart(socketFd: number, frame: Buffer, fds: number[]): { pending: PendingFdSend; left: number } | null;
  /**
   * Sends what the socket takes now of a pending send and returns the bytes still to send: 0 once
   * every byte went (its duplicate is then closed). With `deadlinePassed`, E_FD_TIMEOUT naming
   * `timeoutMs` when bytes are left; E_FD_SEND on an error. Either error ends it.
   */
  fdSendSome(pending: PendingFdSend, deadlinePassed: boolean, timeoutMs: number): number;
  /** Gives a pending send up: its duplicate of the socket is closed now. A no-op once it ended. */
  fdSendEnd(pending: PendingFdSend): void;
  /**
   * Connects to `path` (a server of another uid is refused, E_PEER_UID), sends `frame` and `fds`
   * as fdSendStart does (waiting on a libuv thread for the socket to take the rest), and reads one reply frame (10-byte header: magic, u16 BE version, u32 BE
   * payload length; the magic is the caller's to check) of at most maxReplyBytes, header included.
   * On failure every received fd is closed. E_CONNECT, E_PEER_UID, E_FD_SEND, E_FD_TIMEOUT,
   * E_FD_RECV, E_FRAME_TOO_LARGE, E_PEER_CLOSED.
   */
  unixRequest(path: string, frame: Buffer, fds: number[], timeoutMs: number, maxReplyBytes: number): Promise<UnixReply>;
  /**
   * native/update_segments.h, on a libuv thread: a fresh memfd of `bytes` (sealed against shrink
   * and grow, not write) holding a copy of the first `bytes` of the sealed segment `sourceFd`.
   * Resolves to its descriptor, the caller's to close (closeFd).
   */
  createWritableCopy(sourceFd: number, bytes: number, name: string): Promise<number>;
  /**
   * native/update_segments.h, on a libuv thread: a fresh memfd of `bytes`, zero, its pages reserved
   * (E_OUT_OF_MEMORY when they do not fit), sealed against shrink and grow, not write. Resolves to
   * its descriptor, the caller's to close (closeFd).
   */
  createWritableSegment(bytes: number, name: string): Promise<number>;
  /** Seals a segment createWritableSegment or createWritableCopy made against write, on a libuv thread: E_UPDATE_MAPPED, naming `command` (the commit sealing it), while a process still maps it writable. */
  sealWritten(fd: number, segment: number, command: 'commit_update' | 'commit_publish'): Promise<void>;
  /**
   * native/cuda_update_segments.h, on a libuv thread: a fresh VMM allocation on visible device
   * `deviceIndex` holding a device-to-device copy of the served "cuda-fd" segment `sourceFd`
   * (`bytes`). Resolves to its exported descriptor, the caller's to close (the daemon's only
   * reference to it). E_OUT_OF_MEMORY names the bytes needed and free.
   */
  cudaStagingCopy(deviceIndex: number, sourceFd: number, bytes: number): Promise<number>;
  /** native/cuda_update_segments.h, on a libuv thread: a fresh staging allocation of `bytes` (content undefined), its exported descriptor the caller's. */
  cudaStagingFresh(deviceIndex: number, bytes: number): Promise<number>;
  /**
   * At commit (native/cuda_update_segments.h): copies each staging descriptor `fds[i]` with
   * `copied[i]` into a fresh final allocation (its descriptor in `fds[i]` of the result, -1 for a
   * shared segment), then digests `tensorRanges` over the final and shared segments: with
   * `digestOn` 'gpu', by the fill's digest kernel where it loads, else (`gpuDigestUnavailable` says
   * why), or with 'cpu', on `threads` CPU threads.
   */
  cudaCommitCopies(
    deviceIndex: number,
    fds: number[],
    copied: boolean[],
    bytes: number[],
    tensorRanges: PackedTensorRanges,
    threads: number,
    digestOn: 'gpu' | 'cpu',
  ): Promise<{ fds: number[]; timings: CommitTimings } & CudaDigested>;
  /**
   * A pull's commit (native/cuda_update_segments.h, cudaPullCommit): as cudaCommitCopies, but each
   * final allocation (`copied`) is written by `commitCopies` alone, from `fds[segment]` (the base's
   * segment: source 0) or from the writer's memory behind legacy IPC handle `sources[k - 1]` (64
   * bytes each), opened for the copies and closed before the digests. `finals` (empty, or one per
   * segment): a final made and written earlier by cudaPullCopies, used instead of
   * a new one (its descriptor stays the caller's; the result holds a duplicate), -1 where none;
   * `prepared`, a cudaPrepareFinals set whose finals are used where they are mapped.
   * E_UPDATE_SOURCE: a handle that does not open; E_UPDATE_SIZE: a copy past its source's allocation.
   */
  cudaPullCommit(
    deviceIndex: number,
    fds: number[],
    copied: boolean[],
    bytes: number[],
    finals: number[],
    sources: Buffer[],
    commitCopies: PackedCommitCopies,
    tensorRanges: PackedTensorRanges,
    threads: number,
    digestOn: 'gpu' | 'cpu',
    prepared?: number,
  ): Promise<{ fds: number[]; timings: CommitTimings } & CudaDigested>;
  /**
   * A pull's finals made before its tensors are named (native/cuda_update_segments.h,
   * cudaPrepareFinals): a fresh final for each segment with `which` (E_OUT_OF_MEMORY), mapped in
   * this process and kept so under `id` until cudaDropPrepared, so that cudaPullCopies and
   * cudaPullCommit given `id` copy straight into them. `fds`: their descriptors (the caller's), -1
   * elsewhere; a failure leaves nothing made.
   */
  cudaPrepareFinals(deviceIndex: number, which: boolean[], bytes: number[]): Promise<{ id: number; fds: number[]; timings: { allocateMs: number; nativeMs: number } }>;
  /** Unmaps prepared set `id` here (its memory stays with the descriptors); an unknown `id` is no error. */
  cudaDropPrepared(id: number): Promise<void>;
  /**
   * A pull's early copies (native/cuda_update_segments.h, cudaPullCopies): for each segment that
   * `writes`, the final `finals[segment]` (the daemon's own allocation's descriptor, the caller's)
   * or, where -1, a fresh one made here (E_OUT_OF_MEMORY; its descriptor in `fds`, the caller's),
   * and its `commitCopies` (sources k > 0 only, `sources[k - 1]`, opened once for the call) queued
   * as soon as it is made, with zeros over its `zeroRanges` (the bytes no tensor holds); done when
   * it resolves, the sources closed. Then the digests of
   * `tensorRanges` (`file` indexing the segments, each in one it `writes`: E_BAD_PLAN otherwise)
   * over what the copies wrote, hashed where `digestOn` says, as cudaCommitCopies. E_UPDATE_SOURCE,
   * E_UPDATE_SIZE as cudaPullCommit's; a failure leaves nothing made. `prepared`: a cudaPrepareFinals
   * set whose mapped finals (also in `finals`) it copies into without mapping them again.
   */
  cudaPullCopies(
    deviceIndex: number,
    finals: number[],
    writes: boolean[],
    bytes: number[],
    sources: Buffer[],
    commitCopies: PackedCommitCopies,
    zeroRanges: PackedZeroRanges,
    tensorRanges: PackedTensorRanges,
    threads: number,
    digestOn: 'gpu' | 'cpu',
    prepared?: number,
  ): Promise<{ fds: number[]; timings: PullCopyTimings } & CudaDigested>;
  /**
   * A pull plan (native/cuda_pull_plans.h): what cudaPullCopies makes before its copies (the
   * writer's memory opened, the copies checked, the digest kernel's module, buffers and streams),
   * made once and kept under `id` until cudaClosePullPlan. Errors as cudaPullCopies's; a failure
   * leaves nothing. `gpuDigestUnavailable`: why its runs hash on the CPU, "" where they do not.
   */
  cudaOpenPullPlan(
    deviceIndex: number,
    writes: boolean[],
    bytes: number[],
    sources: Buffer[],
    commitCopies: PackedCommitCopies,
    zeroRanges: PackedZeroRanges,
    tensorRanges: PackedTensorRanges,
    digestOn: 'gpu' | 'cpu',
  ): Promise<{ id: number; gpuDigestUnavailable: string; timings: { openMs: number; setupMs: number; moduleMs: number; nativeMs: number; copiedByKernelBytes: number } }>;
  /** One update's copies by plan `id`, as cudaPullCopies with the plan's arguments (E_BAD_PLAN once it is closed); its openMs, setupMs and moduleMs are 0. */
  cudaRunPullPlan(id: number, finals: number[], threads: number, prepared?: number): Promise<{ fds: number[]; timings: PullCopyTimings } & CudaDigested>;
  /** Closes plan `id` (after a run in flight; its resources go on the releaser's thread); an unknown `id` is no error. */
  cudaClosePullPlan(id: number): Promise<void>;
  /**
   * Digests `tensorRanges` (`file` indexing the segments) over the allocations behind "cuda-fd"
   * descriptors `fds` (`bytes` each), imported read-only on visible device `deviceIndex` for the
   * call (native/cuda_segment_digests.h): where `digestOn` says, as cudaCommitCopies. The
   * descriptors stay the caller's.
   */
  cudaDigestSegments(deviceIndex: number, fds: number[], bytes: number[], tensorRanges: PackedTensorRanges, threads: number, digestOn: 'gpu' | 'cpu'): Promise<CudaDigested>;
  /** Closes a descriptor this process received; E_FD_CLOSE when it is not open. */
  closeFd(fd: number): void;
  /**
   * Closes descriptors on a libuv thread, every one even when one fails (the first failure,
   * E_FD_CLOSE, rejects): the last descriptor of an exported CUDA allocation frees its GPU memory
   * inside close(), milliseconds the main thread would otherwise spend before its next reply.
   */
  closeFdsAsync(fds: number[]): Promise<void>;
  /**
   * Opens `path` read-only: the descriptor is the caller's (closeFd) or a device's that adopts it.
   * Not fs.openSync: Node closes what its fs opened when the thread's environment ends, a second
   * close after the device's (of a number another file may hold by then).
   */
  openReadOnly(path: string): number;
  /** A new descriptor of what `fd` holds (close-on-exec), the caller's to close: for a file no path reopens (a CUDA VMM export). */
  dupFd(fd: number): number;
  /**
   * One rank of a node's fill group (FillOptions.group) will not fill: it adopted its shard from
   * the keeper. The others fill without it (cuda: native/cuda_fill_group.h; host, which shares
   * only the digests' hashing: native/host_digest_group.h); without this they would wait for it for ever.
   */
  leaveFillGroup(backend: 'cuda' | 'host', id: string, size: number): void;
  /** What CUDA offers this process (runs cuInit); never rejects for a missing driver or GPU. */
  cudaProbe(): Promise<CudaProbe>;
  /** native/cuda_warmup.h on a libuv thread: cuInit, then GPUs 0..devices-1's primary contexts; never rejects. */
  warmCuda(devices: number, stagingBytes: number): Promise<void>;
  endCudaWarmup(): void;
  /** How much of these files the page cache holds now (mincore; reads nothing): residentBytes of sampledBytes, a sample of the files' totalBytes (native/page_cache.h). */
  pageCacheResidency(paths: string[]): Promise<{ residentBytes: number; sampledBytes: number; totalBytes: number }>;
  /** The digests of `tensorRanges` read from disk (through the page cache) on `threads` threads: what a fill of them reports. */
  digestFiles(paths: string[], tensorRanges: PackedTensorRanges, threads: number): Promise<string[]>;
  /**
   * The `content` fingerprint's digest of one file's sampled `ranges` ([begin, end) pairs,
   * ascending; src/checkpoint/sampleContent.ts), read from `fd` with one read per run of ranges at
   * most `mergeGap` apart; or where the file ended, or which read failed and why.
   */
  sampleDigest(fd: number, ranges: Float64Array, mergeGap: number): Promise<{ digest?: string; endedAt?: number; failedAt?: number; reason?: string }>;
  /** Opens another process's legacy IPC handle (base64) on a visible device. */
  cudaOpenIpc(deviceIndex: number, handle: string): CudaIpcMapping;
  /**
   * Maps the VMM memory behind a "cuda-fd" segment's descriptor (`bytes` of it) on a visible device;
   * the caller keeps `fd` and may close it at once. Closed with cudaCloseIpc, read with cudaReadDevice.
   */
  cudaOpenFd(deviceIndex: number, fd: number, bytes: number): CudaIpcMapping;
  cudaCloseIpc(pointer: bigint): void;
  /** Fills `dst` from `offset` of a mapping cudaOpenIpc returned. Read through readInChunks. */
  cudaReadDevice(deviceIndex: number, pointer: bigint, offset: number, dst: Uint8Array): Promise<void>;
}

/** What the binary exports besides Addon: load() calls it once, before anything else. */
interface Binding extends Addon {
  /** Every native error is made by `factory` (native/addon.cpp makeError). */
  setErrorFactory(factory: (code: NativeErrorCode, message: string, callSite?: Error) => Error): void;
}

const addonPath = fileURLToPath(new URL('../../../build/Release/weightd.node', import.meta.url));

/**
 * The one place native failures get weightd's class: the addon calls this for every error it
 * makes. An async call's error is made after its caller's stack is gone, so it takes the stack of
 * `callSite`, an Error the addon made when the call was made.
 */
function nativeError(code: NativeErrorCode, message: string, callSite?: Error): DeviceError {
  const err = new DeviceError(code, message);
  const stack = callSite?.stack ?? '';
  const frames = stack.indexOf('\n');
  if (frames >= 0) err.stack = `${err.name}: ${message}${stack.slice(frames)}`;
  return err;
}

function load(): Addon {
  let binding: Binding;
  try {
    binding = createRequire(import.meta.url)(addonPath) as Binding;
  } catch (err) {
    throw new DeviceError(
      'E_ADDON_LOAD',
      `cannot load the native addon ${addonPath}: ${(err as Error).message}; rebuild it with "npm run build:native"`,
      { path: addonPath },
      { cause: err },
    );
  }
  binding.setErrorFactory(nativeError);
  return binding;
}

let loaded: Addon | undefined;

/**
 * The addon, loaded on first use. Lazily rather than as a second, client-only binary: a client
 * that never maps memory (or `weightd --help`) then loads no native code at all, while one that
 * does needs the same CUDA driver loader, errors and build as the daemon, which one binary
 * keeps in one place. A missing addon fails the first call that needs it, with E_ADDON_LOAD.
 */
export function addon(): Addon {
  loaded ??= load();
  return loaded;
}
