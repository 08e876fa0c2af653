// Typed messages between a rank actor (main thread) and its worker thread, and what its phases
// hand each other (src/actors/rankPhases.ts, src/machines/rankWorkerMachine.ts).
import type { RankFillPlan } from '../checkpoint/types.js';
import type { FileIdentity } from '../files/fileIdentity.js';
import type { SerializedError } from '../errors.js';
import type { RankSource } from '../nodeStatus.js';
import type { KeptLoad, KeptWritten } from '../keeper/keptRecord.js';
import type { KeptPlan } from '../keeper/keptPlan.js';
import type { CudaHandles, DeviceInfo, DeviceSlot, FillOptions, SegmentExport } from '../native/addon.js';
import type { FillResult } from '../native/deviceHandle.js';

export interface RankWorkerData {
  nodeRank: number;
  localRank: number;
  globalRank: number;
  device: DeviceSlot;
  /** cuda: how segments are allocated and exported (--cuda-handles). */
  cudaHandles: CudaHandles;
  plan: RankFillPlan;
  /** The checkpoint files' identity as planned (CheckpointPlan.files): checked once resident, and what the keeper's record carries. */
  files: FileIdentity[];
  fill: FillOptions;
  /** Where this rank's segments are kept beyond the daemon (absent: --keeper off). */
  keeper?: RankKeeping;
  /**
   * Hand the keeper the segments once told (KEEP), not once loaded: a model loaded beside
   * others (LOADED_BESIDE) is kept once it serves, so one that fails before (its files changed, a sibling
   * rank failed, its group aborted it) leaves nothing in the keeper for this daemon's life.
   */
  keepOnceServing?: boolean;
  /**
   * Wait, once the device is open and reported (DEVICE, with its free memory), for ADMIT before
   * allocating: a model loaded beside others is refused before anything is allocated when its
   * ranks do not fit (src/models/modelFit.ts).
   */
  awaitAdmission?: boolean;
  /** A version a writer committed: what the rank adopts instead of allocating and filling (PlannedModel.written). */
  written?: WrittenRankData;
  /**
   * The main thread asked the keeper for this shard before this worker started
   * (src/actors/adoptHere.ts) and adopted nothing: the worker loads without asking again.
   * refused: why the keeper's record was refused (and dropped there), for the status.
   */
  keeperAsked?: { refused?: string };
}

/**
 * One local rank of a version a writer committed (PlannedModel.written): its sealed segments'
 * paths at the commit, or none when restored from the keeper (the rank takes its kept shard);
 * its tensors' digests (the commit's); which segments are the base's own memory.
 */
export interface WrittenRankData {
  segmentPaths?: string[];
  /** cuda: the final allocations' descriptors, in order, which the rank duplicates to adopt (no path reopens a VMM export). */
  segmentFds?: number[];
  /**
   * cuda, at the commit: per segment, the memory (SegmentExport.memory) of the base's segment it
   * is, null for one the writer wrote (an allocation of its own), so that memory versions share
   * is counted once (src/models/evictionPolicy.ts); at a restart the restored base's names for the
   * segments the record shares (ModelControl). On the host a memfd's inode says it.
   */
  segmentMemory?: (string | null)[];
  digests: string[];
  shared: number[];
}

/** What a rank needs to adopt kept segments and to keep its own (src/keeper/). */
export interface RankKeeping {
  /** The keeper's socket. */
  socket: string;
  /** The checkpoint directory and this weightd's name and version, for the record. */
  model: string;
  writer: string;
  /** A model loaded at run time: its load request, which the record carries so a restart restores it (src/actors/restoreLoaded.ts). */
  load?: KeptLoad;
  /** The model's plan, on its local rank 0 only: its record carries it, so a restart plans from it (src/keeper/keptPlan.ts). */
  plan?: KeptPlan;
  /**
   * When this rank's version last became current (ms since the epoch: a commit, a rollback, a
   * restart's): its record carries it, and a restart makes the version of the latest current again.
   */
  currentSince?: number;
  /** A version a writer committed: what its record says besides the rank's own (KeptWritten, less this rank's digests and shares). */
  written?: Pick<KeptWritten, 'name' | 'version' | 'base' | 'fields' | 'manifest'>;
  /**
   * The pid of the keeper found to be of a build before 2026-12-05 (a KEEP past 1 MiB refused on
   * its header: docs/spec/keeper-wire.md §5), 0 for none, in memory every rank's thread shares for
   * the daemon's life (one per node, src/actors/prepareNode.ts): a rank's record past that limit
   * then goes without its plan at once, so that such a keeper refuses one KEEP per daemon, not one
   * per model and keep. Absent: each KEEP finds out alone.
   */
  earlierKeeper?: Int32Array;
}

/** How a rank's phases post to the main thread. */
export type Post = (m: RankToMain) => void;

export type RankToMain =
  /**
   * The device as opened, with its free memory. adoptable: a rank that awaits admission found a
   * shard of its own in the keeper (checked, not yet taken), which it adopts with no new memory.
   */
  | { type: 'DEVICE'; info: DeviceInfo; adoptable?: boolean }
  | { type: 'PROGRESS'; bytes: number; totalBytes: number; seconds: number; waitingForGroup: boolean }
  /**
   * digests: RankFillPlan.contentTensors' digests, in order (empty: an adopted record that had none).
   * descriptors: 'checking' when the segments are adopted descriptors not yet imported into a
   * CUDA context (Resident.descriptors): no client gets them before DESCRIPTORS_CHECKED.
   */
  | { type: 'LOADED'; info: DeviceInfo; segments: SegmentExport[]; bytes: number; seconds: number; source: RankSource; digests: string[]; descriptors?: 'checking' }
  /**
   * The check of a LOADED's descriptors 'checking' ended: passed, with the device's info now that
   * it has a context (its free memory measured; absent if the device was busy), or failed (then a
   * FAILED follows, and the rank's kept shard has been dropped).
   */
  | { type: 'DESCRIPTORS_CHECKED'; info?: DeviceInfo; error?: SerializedError }
  /**
   * Whether the keeper holds this rank's segments now (after a keep, a failed one, or a drop).
   * currentSince: after a keep, the RankKeeping.currentSince its record carried (or would have):
   * what a rollback waits for (ModelControl).
   */
  | { type: 'KEPT'; kept: boolean; reason?: string; currentSince?: number }
  | { type: 'FAILED'; error: SerializedError }
  | { type: 'RELEASED' }
  | { type: 'LOG'; level: 'debug' | 'info' | 'warn' | 'error'; msg: string; fields?: Record<string, unknown> };

/**
 * The first message to a rank's worker thread started warm (src/actors/warmRankWorker.ts): the
 * rank it now is, and the module to run as it (what a thread started for its rank is given as
 * its filename and workerData).
 */
export interface WarmRankStart {
  type: 'START';
  module: string;
  data: RankWorkerData;
}

/**
 * KEEP_AGAIN: a keeper (re)started; hand it this rank's segments if it does not hold them.
 * ADMIT: the load fits (RankWorkerData.awaitAdmission): allocate and fill.
 * KEEP: the rank's model serves (RankWorkerData.keepOnceServing): hand the keeper its segments.
 * UNKEEP: the rank's model drains (unloaded, or a newer version serves): the keeper drops its
 * segments now, so a restart meanwhile does not bring it back; the rank's own memory stays
 * until its last lease ends.
 */
export type MainToRank = { type: 'RELEASE' } | { type: 'STOP' } | { type: 'KEEP_AGAIN'; currentSince?: number } | { type: 'ADMIT' } | { type: 'KEEP' } | { type: 'UNKEEP' };

/** How the rank's bytes came to be resident: filled from the checkpoint, or adopted from a keeper. */
export type Resident = Pick<FillResult, 'bytes' | 'seconds' | 'digests'> & {
  source: RankSource;
  /**
   * 'checking': adopted descriptors the device holds unchecked (a cuda rank adopted with no
   * context, src/actors/adoptHere.ts): the rank reports them LOADED, then checks them after READY.
   */
  descriptors?: 'checking';
};

/** What a rank adopted from the keeper (src/actors/rankKeeping.ts). */
export interface Adopted {
  bytes: number;
  seconds: number;
  source: RankSource;
  /**
   * The record's load request is not the one this rank keeps (a model on this command line that
   * an earlier daemon loaded at run time, or the reverse): keep the segments again, with this
   * rank's record, so the next start does not restore (or drop) it by what an earlier daemon knew.
   */
  rekeep: boolean;
  /** The record's full digests (Resident.digests); empty from a record that had none. */
  digests: string[];
  /** Resident.descriptors. */
  descriptors?: 'checking';
}

/** The keeper held this rank's shard, and its record was refused (and the shard dropped): why, for the status. */
export interface NotAdopted {
  refused: string;
}
