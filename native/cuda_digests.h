// The GPU's share of a cuda fill's digests (docs/spec/fingerprint.md §8, issue 29): each digest
// piece that one contiguous copy of a window puts whole into a GPU's memory is hashed there, by
// the digest kernel (native/gpu/xxh3_pieces.cu, one warp per piece), once that window's copies
// have landed and while later windows' copies run. The lanes' CPU threads then only read and
// queue copies; they hash what the GPU cannot (pieces cut by strided copies, bytes no copy
// moves), as before (content_digests.h).
//
// The kernel lies beside the addon (weightd-digests.fatbin) where the build found nvcc
// (CMakeLists.txt), or where WEIGHTD_DIGEST_KERNEL names; without it, on a driver that cannot load it, or where its few buffers do not
// fit, the fill hashes on the CPU and says why (unavailable()).
#pragma once
#include <cuda.h>

#include <string>
#include <vector>

#include "content_digests.h"
#include "cuda_copy_engine.h"
#include "cuda_resources.h"
#include "fill_windows.h"
#include "gpu_digest_job.h"

namespace weightd {

class GpuDigests {
 public:
  // Claims in `digests` the pieces each member's GPU will hash, each piece on the first member
  // whose contiguous copy in some window holds it whole, and puts each member's jobs on its GPU.
  // Pieces of a member whose setup fails are released to the CPU.
  GpuDigests(const std::vector<FillMember>& members, const std::vector<FillWindow>& windows, ContentDigests& digests);
  ~GpuDigests();
  GpuDigests(const GpuDigests&) = delete;
  GpuDigests& operator=(const GpuDigests&) = delete;

  bool hasJobs(size_t window, size_t member) const { return jobsOf(window, member).count > 0; }
  bool anyJobs(size_t member) const { return member < members_.size() && !members_[member].pieces.empty(); }
  // Queues window `window`'s jobs for `member` on `stream`, behind `copied` (the event recorded
  // after that window's copies to the member). The member's context must be current.
  void launch(size_t window, size_t member, CUstream stream, CUevent copied) const;
  // Once every stream the kernels ran on has been synchronised: each member's digests, into
  // `digests`. Throws MemberFailure for a member whose read-back fails.
  void collect(ContentDigests& digests) const;
  // Bytes the GPUs hash (FillControl::digestGpuBytes).
  uint64_t bytes() const { return bytes_; }
  // Why some or all pieces are hashed on the CPU although they could be on the GPU; "" if none.
  const std::string& unavailable() const { return unavailable_; }

 private:
  struct Range {
    uint32_t first = 0;
    uint32_t count = 0;
  };
  struct Member {
    CUcontext context = nullptr;
    CUmodule module = nullptr;
    CUfunction kernel = nullptr;
    std::vector<size_t> pieces;  // per job: its piece in ContentDigests
    DeviceMemory jobs;           // GpuDigestJob per job
    DeviceMemory out;            // 16 canonical bytes per job
  };
  Range jobsOf(size_t window, size_t member) const { return ranges_[window * members_.size() + member]; }
  void setUp(size_t m, const FillMember& member, const std::vector<GpuDigestJob>& jobs);

  const std::vector<FillMember>& fill_;
  std::vector<Member> members_;
  std::vector<Range> ranges_;  // per window, per member
  uint64_t bytes_ = 0;
  std::string unavailable_;
};

}  // namespace weightd
