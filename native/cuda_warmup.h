// CUDA's start-up work done ahead, on another thread, while the daemon loads its modules and
// plans: cuInit (223 ms on the H200 host) and each local GPU's primary context (133 ms each).
// A rank's device later retains the same context and finds it made. The warm-up's own
// references are dropped by endWarmContexts(), once the ranks hold theirs (or have failed):
// a context no rank took then ends with them.
#pragma once
#include <cstdint>

namespace weightd {

// Initialises the driver and retains the primary contexts of devices 0..devices-1 (those that
// exist), then pins `stagingBytes` of host memory for the first fill's staging (pinned_stash.h;
// 0: none), then loads each context's digest kernels (cuda_digest_kernels.h). Never throws: what
// fails here fails again, with its error, where the daemon needs it.
void warmCuda(int devices, uint64_t stagingBytes);

// Drops the references warmCuda took, and any it takes later, and frees the staging no fill took
// (safe to call at any time, and more than once).
void endWarmContexts();

}  // namespace weightd
