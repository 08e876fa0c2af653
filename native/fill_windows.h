// The reads of a CUDA fill, planned per file window instead of per copy op, so that bytes
// several GPUs need (replicated tensors, the shared spans of row-parallel slices) are read from
// the page cache once per node and copied from the same pinned buffer to every GPU.
//
// Every op's source span is marked on its file; overlapping or touching spans merge into
// regions, and each region is cut into windows of at most `capacity` bytes. A window lists the
// pieces of every member's ops that fall inside it: a contiguous piece, or a run of whole rows of
// a strided op (one 2D copy), or the part of a row cut by the window's edge.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "device.h"
#include "read_ranges.h"

namespace weightd {

// One past the last file byte an op reads (ops have at least one row).
inline uint64_t sourceEnd(const CopyOp& op) { return op.srcOffset + (op.rows - 1) * op.srcPitch + op.rowBytes; }

// One copy out of a window, for member `member`: `copy` as a CopyOp (its file is the window's).
struct WindowPiece {
  uint32_t member = 0;
  CopyOp copy;
  uint64_t srcEnd() const { return sourceEnd(copy); }
  uint64_t payload() const { return copy.rows * copy.rowBytes; }
};

// Bytes [start, end) of a file, the tightest range that covers its pieces (ordered by member).
struct FillWindow {
  uint32_t file = 0;
  uint64_t start = 0;
  uint64_t end = 0;
  std::vector<WindowPiece> pieces;
};

// The reads that fill a window's buffer (read_ranges.h): its pieces' rows where their gaps are
// worth skipping, their spans otherwise, merged; starts moved down to multiples of `align`. The
// buffer is an image of the file from the first read's start, so the copies out of it keep
// their file pitch and skipped bytes are simply never written.
std::vector<ByteRange> windowReads(const FillWindow& w, uint64_t align);

// `memberOps[m]` are member m's ops, their `file` fields indexing one file list shared by every
// member. Ops must already be validated (validateOps). `capacity` > 0 bounds each window.
// With several members, neighbouring windows feed different members, so the threads that take
// them in order keep every GPU's link busy at once.
// `cut` (ContentDigests::cut, or none) moves each window's end down to a digest piece's start.
std::vector<FillWindow> planWindows(const std::vector<const std::vector<CopyOp>*>& memberOps, uint64_t capacity,
                                    const std::function<uint64_t(uint32_t file, uint64_t from, uint64_t limit)>& cut = {});

}  // namespace weightd
