// The GPU digest kernels (native/gpu/xxh3_pieces.cu) of each CUDA context, found once and kept
// for the context's life. Every fill that hashed on the GPU loaded their module, and so did every
// pull and commit that digests segments: 0.47-0.57 ms each on an H100 (a pull's moduleMs; of a
// fill's digest setup, 2.3-2.8 ms, it was 0.3-0.4: bench/gpu/results/2026-12-07-h100-digest-kernels-kept).
// The CUDA warm-up loads them ahead (cuda_warmup.cpp), while the daemon plans.
//
// A module belongs to its context, and the context's destruction (the last release of a primary
// context) unloads it: the cache is keyed by the context's id (cuCtxGetId, unique for the
// process's life), so a context made again after one ended loads its own and never finds the
// old one's handles. Nothing here unloads a module.
#pragma once
#include <cuda.h>

#include <string>

namespace weightd {

struct DigestKernels {
  CUfunction hash = nullptr;  // WEIGHTD_HASH_KERNEL
  CUfunction copy = nullptr;  // WEIGHTD_COPY_KERNEL; null where the kernel file predates it
  double loadMs = 0;          // what this call spent loading them: 0 where the context had them
};

// Why the GPU cannot hash here ("" when it can): no kernel file beside the addon, or none at
// WEIGHTD_DIGEST_KERNEL (the file is read once per process).
const std::string& digestKernelMissing();

// The kernels in the current context, loading its module on first use. DeviceError (E_CUDA) where
// the driver cannot load the file (built for another GPU) or it lacks the hashing kernel (built
// from another version's source); a failure is not kept, so the next call tries again.
DigestKernels digestKernels();

// digestKernels() for a context that will fill, ahead of its first fill; never throws (a fill
// that needs them meets the same failure and says why).
void preloadDigestKernels();

}  // namespace weightd
