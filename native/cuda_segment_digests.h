// Content digests (docs/spec/fingerprint.md §8) of tensors in VMM segments: a cuda written
// version's at its commit (cuda_update_segments.h), and `weightd verify` of a served one, which
// digests the daemon's allocations again to compare with what the commit recorded.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fill_records.h"

namespace weightd {

struct CudaDigests {
  // Each tensor's digest (content_digests.h), in the order asked.
  std::vector<std::string> digests;
  // Whether the digest kernel hashed them (else the CPU did, or there was nothing to hash).
  bool onGpu = false;
  // Why the digest kernel did not hash them ("" when it did; the CPU did then).
  std::string gpuDigestUnavailable;
};

// Each of `tensors`' digest (`file` indexing the segments), over device memory at `segments`
// (`bytes` each; 0 for a segment not mapped, which holds none of them) in the current context: with `onGpu`, on the GPU by the fill's digest kernel
// (cuda_digests.h) where it loads; else (or without `onGpu`: digestOn 'cpu', as a fill's) read
// back a window at a time into pinned memory and hashed on up to `threads` threads.
CudaDigests digestDeviceSegments(const std::vector<CUdeviceptr>& segments, const std::vector<uint64_t>& bytes, std::vector<TensorRange> tensors,
                                 unsigned threads, bool onGpu);

// The same over the allocations behind descriptors `fds` (a served version's "cuda-fd" segments,
// `bytes` each), imported and mapped read-only on visible device `deviceIndex` for the call; the
// descriptors stay the caller's, and nothing else of the call stays.
CudaDigests cudaDigestSegments(int deviceIndex, const std::vector<int>& fds, const std::vector<uint64_t>& bytes, std::vector<TensorRange> tensors,
                               unsigned threads, bool onGpu);

}  // namespace weightd
