// Pull plans (docs/weight-updates.md, "Pull plans"): a trainer's parameters stay in the same
// allocations from one step to the next, so what a pull does before its copies (opening the
// writer's memory over IPC, checking and sorting the copies, loading the digest kernel and making
// its buffers and streams) can be done once, when the writer names its tensors, and kept for every
// update after. Each plan lives in a process-wide table under a number that the daemon's plan desk
// holds for as long as the writer's connection that made it (src/serve/pullPlans.ts).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_update_segments.h"

namespace weightd {

struct PullPlanMade {
  // The plan's number (never 0), for cudaRunPullPlan and cudaClosePullPlan.
  uint32_t id = 0;
  // Why its digests are hashed on the CPU at each run though the GPU was asked ("" where not).
  std::string gpuDigestUnavailable;
  // openMs: the writer's memory opened; setupMs: the digest kernel's module (moduleMs of it), its
  // job table and buffers, the streams; totalMs: the whole call.
  double openMs = 0, setupMs = 0, moduleMs = 0, totalMs = 0;
  uint64_t copiedByKernelBytes = 0;
};

// Makes a plan on visible device `deviceIndex`: a PullWork over segments of `bytes` that the copies
// write (`writes`), from `sources` (legacy CUDA IPC handles), with `copies`, `zeros` and the
// `tensors` to digest as cudaPullCopies takes them. Errors as cudaPullCopies's; on a failure
// nothing of it is left.
PullPlanMade cudaOpenPullPlan(int deviceIndex, const std::vector<bool>& writes, const std::vector<uint64_t>& bytes, const std::vector<std::string>& sources,
                              const std::vector<CommitCopy>& copies, const std::vector<ZeroRange>& zeros, std::vector<TensorRange> tensors, bool onGpu);

// One update's copies by plan `id`, as cudaPullCopies makes them (`finals`, `prepared`, `threads`
// as there): the same copies from the same memory every time, which the writer keeps allocated and
// unchanged until the reply. E_BAD_PLAN where no such plan is (closed) or its segments are not
// `finals.size()`. One run of a plan at a time (another waits).
CudaPulled cudaRunPullPlan(uint32_t id, const std::vector<int>& finals, unsigned threads, uint32_t prepared);

// Closes plan `id`: the writer's memory it opened, the kernel's module and buffers, the streams go
// on the releaser's thread (deferred_release.h), after a run in flight. An unknown number is no
// error (closed already).
void cudaClosePullPlan(uint32_t id);

}  // namespace weightd
