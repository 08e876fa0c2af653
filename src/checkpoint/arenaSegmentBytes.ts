// How large each segment of a rank's arena is when a plan file does not say (docs/sharding.md,
// "Segments"). On the host backend a segment is one memfd, and the kernel makes a memfd's pages
// and copies its pwrites under the file's inode lock, so one segment per rank makes the
// allocation and the fill serial however many threads run them: 1.9 GB took 0.82 s to allocate
// and fill in one segment, 0.55 s in seven (bench/results/2026-12-05-host-fill-alloc); as the
// default, READY 0.31-0.35 s sooner with a core to spare (bench/results/2026-12-06-host-segments-default).
// The cut is the plan's, not the device's, because a segment is what a client maps and a keeper keeps.

/** Below twice this a host arena stays whole; no host segment is cut smaller (but the last). */
export const HOST_SEGMENT_MIN_BYTES = 64 * 1024 * 1024;
/**
 * The most segments the default cuts a host arena into. Each is one descriptor per attach
 * (SCM_RIGHTS, sent in batches of 250) and per keeper record (at most 4096), and one thread of
 * the reservation (native/host_device.cpp, 8 at once): far below every limit, and past the
 * parallelism that page making has on the nodes measured.
 */
export const HOST_SEGMENTS_MAX = 16;

/**
 * How an arena is cut when the plan file sets no segmentBytes: 'whole' (one segment a rank, the
 * cuda backend's: its VMM allocations have no such lock) or 'host' (hostSegmentBytes).
 */
export type SegmentCut = 'whole' | 'host';

/**
 * The segmentBytes of planCheckpoint's cut for an arena of `arenaBytes` (an upper bound is
 * enough: a segment ends after the tensor that takes it to segmentBytes, so at most
 * ceil(arenaBytes / segmentBytes) segments come out). Infinity: one segment.
 */
export function hostSegmentBytes(arenaBytes: number): number {
  if (arenaBytes < 2 * HOST_SEGMENT_MIN_BYTES) return Infinity;
  return Math.max(HOST_SEGMENT_MIN_BYTES, Math.ceil(arenaBytes / HOST_SEGMENTS_MAX));
}

/** The segmentBytes planning cuts with: the plan file's when it sets one, else the cut's default. */
export function arenaSegmentBytes(cut: SegmentCut, arenaBytes: number, planFileBytes?: number): number {
  if (planFileBytes !== undefined) return planFileBytes;
  return cut === 'host' ? hostSegmentBytes(arenaBytes) : Infinity;
}
