// The copy engine of the CUDA backend: checkpoint bytes from files to device memory at the
// speed of the host-to-device link, with a bounded amount of pinned host memory.
//
// Reader threads (runChunks) each own a lane: a stream and a few slots. A slot is one pinned
// staging buffer (pread mode) or one pinned window of the mapped file (register mode) plus the
// event that says when the copy reading it has finished. A thread fills a slot, queues the copy
// on its stream and moves to its next slot, so disk or page-cache reads overlap the DMA of the
// previous chunk; it waits for a slot's event only when it comes round to that slot again.
// Strided (row-parallel) chunks move as one 2D copy from the contiguous source span of their
// rows, so there is no CPU gather.
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
};

// Runs on the calling thread plus options.threads - 1 more, each with `context` current while it
// works. Adds to progress.bytes as copies complete on the device; stops on progress.cancel.
// Returns only after every queued copy has finished (or, on failure, been drained).
void cudaFill(const CudaFillTarget& target, const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
              const FillOptions& options, FillProgress& progress);

}  // namespace weightd
