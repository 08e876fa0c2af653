// Pinned host memory made ahead for the first cuda fill's staging. Pinning is the most a fill
// spends before its first read: 32 MiB took 12.5-14.8 ms on an H100 (about 0.4 ms per MiB,
// bench/gpu/fill-setup-probe.py, 2026-12-06), 7% of an 8.2 GB hot fill, on the path to READY.
// The CUDA warm-up (cuda_warmup.cpp) pins one block while the daemon loads its modules and plans;
// the first fill whose staging fits in it takes it, and what no fill took is freed once the ranks
// are loaded (endWarmContexts), so the daemon holds no pinned memory it does not use.
#pragma once
#include <cstdint>

#include "cuda_resources.h"

namespace weightd {

// Pins `bytes` (with a context current) and keeps them for takeStashedPinned, unless the stash was
// dropped already or holds a block. Never throws: a fill that finds nothing pins its own.
void stashPinned(uint64_t bytes);

// The stashed block when it holds at least `bytes`, else an empty one.
PinnedHostMemory takeStashedPinned(uint64_t bytes);

// Frees the stashed block, if any, and stashes nothing from then on.
void dropStashedPinned();

}  // namespace weightd
