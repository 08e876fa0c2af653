// Which file bytes a fill reads to cover its copies. A row-parallel (strided) op needs only its
// rows: at tp=8 a rank's slice of each row is an eighth of the row, and reading the whole span
// made a node with one GPU read about 3.5 times its share of the checkpoint. Gaps between the
// needed bytes are skipped once they are worth a read of their own, and read through otherwise.
#pragma once
#include <cstdint>
#include <vector>

#include "fill_records.h"

namespace weightd {

// Gaps shorter than this are read through. The page cache reads whole 4 KiB pages, so skipping
// less than a page saves no disk read, only the copy of a few KiB, which costs less than the
// system call a separate read needs (the same reasoning as the fingerprint sample's merge gap,
// src/checkpoint/sampleContent.ts).
constexpr uint64_t kMinSkippedGap = 4096;

// Bytes [start, end) of one file.
struct ByteRange {
  uint64_t start = 0;
  uint64_t end = 0;
};

// Whether `op`'s rows are read one by one (their gaps are worth skipping) rather than as one span.
inline bool readsRowsApart(const CopyOp& op) { return op.rows > 1 && op.srcPitch - op.rowBytes >= kMinSkippedGap; }

// Appends the file bytes `op` needs: one range per row when readsRowsApart, else its whole span.
void appendNeeded(const CopyOp& op, std::vector<ByteRange>& out);

// The reads that cover `needed` (any order, may overlap), ascending and disjoint: each start
// moved down to a multiple of `align` (1: none; O_DIRECT needs its block size), then ranges
// whose aligned extents overlap or lie less than kMinSkippedGap apart merged. Ends stay where
// the bytes end, since an aligned read of the file's last block comes back short: an aligned
// reader reads on to the end's block boundary, which never reaches the next range's start.
std::vector<ByteRange> coalesceReads(std::vector<ByteRange> needed, uint64_t align);

}  // namespace weightd
