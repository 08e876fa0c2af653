// The copy engine of the CUDA backend: checkpoint bytes from files to the memory of one or more
// GPUs at the speed of the host-to-device links, with a bounded amount of pinned host memory.
//
// Reads are planned per file window (fill_windows.h), not per tensor: a window is read once and
// copied from the same buffer to every GPU that needs part of it, so a node filling several GPUs
// reads replicated tensors and the shared spans of row-parallel slices once, not once per GPU.
//
// Reader threads (reader_threads.h) each own a lane: a stream per GPU and two slots. A slot is one
// pinned staging buffer (pread mode) or one pinned window of the mapped file (register mode) plus,
// per GPU, the event that says when the copies reading it have finished. A thread fills a slot,
// queues its copies and moves to its other slot, so disk or page-cache reads overlap the DMA of
// the previous window; it waits for a slot's events only when it comes round to that slot again.
// Strided (row-parallel) pieces move as one 2D copy out of an image of their rows' span in the
// staging buffer, so there is no CPU gather; only the rows are read into it where the gaps
// between them are worth skipping (read_ranges.h), so a node reads its ranks' slices, not the span.
#pragma once
#include <cuda.h>

#include <string>
#include <vector>

#include "device.h"

namespace weightd {

struct CudaFillTarget {
  CUcontext context = nullptr;
  std::vector<CUdeviceptr> segmentBases;
  std::vector<uint64_t> segmentBytes;
  std::string label;  // "GPU 1 (GPU-uuid)": prefixes errors that concern this target
};

// One GPU's share of a fill: its arena, its files and ops (op.file indexes `files`) and where
// its landed bytes are counted and its cancel is asked for.
struct FillMember {
  CudaFillTarget target;
  const std::vector<std::string>* files = nullptr;
  const std::vector<CopyOp>* ops = nullptr;
  // What to digest (content_digests.h): hashed once for the group, and each member's
  // control->digests gets the digests of its own list.
  const std::vector<TensorRange>* tensors = nullptr;
  FillControl* control = nullptr;
};

// A failure that concerns one member (its ops, its files, its GPU), labelled with its GPU, so
// a group can tell the member that caused it from the ones that only share its fill.
class MemberFailure : public DeviceError {
 public:
  MemberFailure(size_t member, const CudaFillTarget& target, const DeviceError& e)
      : DeviceError(e.code(), target.label.empty() ? e.what() : target.label + ": " + e.what()), member_(member) {}
  size_t member() const { return member_; }

 private:
  size_t member_;
};

// Fills every member's arena in one pass over the files, on the calling thread plus
// options.threads - 1 more, digesting the members' tensors as the windows pass (each window is
// hashed while its copies run) and reading at the end only what no window held whole. Adds to each member's control.bytes as its copies complete on its
// device; stops when any member's control.cancel is set. Returns only after every queued copy
// has finished (or, on failure, been drained). An error in any member fails the whole fill.
void cudaFill(const std::vector<FillMember>& members, const FillOptions& options);

}  // namespace weightd
