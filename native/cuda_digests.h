// The GPU's share of a cuda fill's digests (docs/spec/fingerprint.md §8, issue 29): each digest
// piece that one contiguous copy of a window puts whole into a GPU's memory is hashed there, by
// the digest kernel (native/gpu/xxh3_pieces.cu, one warp per piece), on a stream of the lane's
// own behind the event of its windows' copies, so later windows' copies never wait for it. The
// lanes' CPU threads then only read and queue copies (and a launch per 64 MiB of pieces); they
// hash what the GPU cannot (pieces cut by strided copies, bytes no copy moves), as before
// (content_digests.h).
//
// The kernel lies beside the addon (weightd-digests.fatbin) where the build found nvcc
// (CMakeLists.txt), or where WEIGHTD_DIGEST_KERNEL names; without it, on a driver that cannot
// load it, or where its few buffers do not fit, the fill hashes on the CPU and says why
// (unavailable()).
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

// A copy into a segment that the digest kernel may make as it hashes (a pull's, from the writer's
// memory): `bytes` bytes from device address `from` to bytes [dstOffset, dstOffset + bytes) of
// segment `segment`.
struct SegmentCopy {
  uint32_t segment = 0;
  uint64_t dstOffset = 0;
  uint64_t bytes = 0;
  CUdeviceptr from = 0;
};

// The digest kernel over segments of device memory (a written version's), some segments at a
// time: their pieces are hashed on a stream as soon as they are launched there (a pull launches a
// batch of segments behind their copies, cuda_update_segments.cpp, so the hashing overlaps the
// making of the next ones). Everything runs in the context current at construction.
class SegmentHasher {
 public:
  // Why the kernel cannot hash here ("" when it can): the addon was built without it.
  static const std::string& unavailable();
  // Claims every piece of `digests` lying in its files 0..segments-1 (the segments) and puts the
  // kernel and room for their jobs on the GPU. DeviceError where that fails, with nothing left
  // held and the claims given back: the caller hashes on the CPU.
  //
  // A piece that lies whole in one of `copies`, at an address 8-byte aligned on both sides, is
  // copied by the kernel as it hashes it (read once, where copying then hashing read it twice):
  // the caller copies only the rest of each copy (copiedByKernel), before the launch of its
  // segment as for any copy. The copies must share no byte (a pull's batch, cudaPull.ts).
  SegmentHasher(ContentDigests& digests, size_t segments, const std::vector<SegmentCopy>& copies = {});
  ~SegmentHasher();
  SegmentHasher(const SegmentHasher&) = delete;
  SegmentHasher& operator=(const SegmentHasher&) = delete;
  // Queues the hashing of the pieces of segments [from, to), segment s's memory at bases[s], on
  // `stream`: one upload of their jobs (consecutive in the table) and one launch per million of them.
  void launch(size_t from, size_t to, const CUdeviceptr* bases, CUstream stream);
  // Once every launch's stream is synchronised: the pieces' digests, into `digests`.
  void collect();
  // Gives every claimed piece back (after a failure: the CPU hashes them).
  void releaseAll();
  // The byte ranges of `segment` the kernel copies, sorted [start, end) (none but where the
  // constructor was given copies), and their total over every segment.
  const std::vector<std::pair<uint64_t, uint64_t>>& copiedByKernel(size_t segment) const { return copiedBy_[segment]; }
  uint64_t bytesCopiedByKernel() const { return bytesCopied_; }
  // Loading the kernel's module, in ms (part of a pull's setupMs): 0 where its context had it
  // (cuda_digest_kernels.h).
  double moduleMs() const { return moduleMs_; }

 private:
  ContentDigests& digests_;
  std::vector<size_t> pieces_;                      // per job: its piece
  std::vector<std::pair<uint32_t, uint32_t>> of_;  // per segment: its jobs' first and count
  std::vector<GpuDigestJob> jobs_;                 // src relative to the segment (staging_: absolute)
  std::vector<CUdeviceptr> from_;                  // per job: where the kernel copies it from, or 0
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> copiedBy_;  // per segment
  uint64_t bytesCopied_ = 0;
  double moduleMs_ = 0;
  CUfunction kernel_ = nullptr;
  DeviceMemory table_, out_;
  PinnedHostMemory staging_;  // the jobs with their absolute addresses, as launched
};

// Hashes on the GPU of the current context every piece of `digests` lying in its files 0..n-1,
// which are device memory at `segments` (`bytes` each; a written version's segments at commit,
// cuda_update_segments.h). Returns "" once every such piece is set, else why the GPU could not,
// with those pieces left unclaimed for the CPU.
std::string hashDeviceSegments(const std::vector<CUdeviceptr>& segments, const std::vector<uint64_t>& bytes, ContentDigests& digests);

class GpuDigests {
 public:
  // Claims in `digests` the pieces each member's GPU will hash, each piece on the first member
  // whose contiguous copy in some window holds it whole. Touches no GPU: load() does.
  GpuDigests(const std::vector<FillMember>& members, const std::vector<FillWindow>& windows, ContentDigests& digests);
  // Finds the kernel (loaded once per context, cuda_digest_kernels.h) and puts each member's jobs
  // on its GPU; the pieces of a member whose setup fails are released to the CPU. Once, before
  // the first add().
  void load();
  ~GpuDigests();
  GpuDigests(const GpuDigests&) = delete;
  GpuDigests& operator=(const GpuDigests&) = delete;

  // Whether `member` has pieces to hash: claimed ones before load(), loaded ones after.
  bool anyJobs(size_t member) const { return member < members_.size() && !members_[member].pieces.empty(); }

  // One lane's jobs for one member not yet launched. A launch and its wait for the copies' event
  // cost the lane's thread microseconds inside the driver, where the other lanes queue their
  // copies, so the lane's windows' jobs go to the GPU together, once they hold kBatchBytes (or
  // the most ranges one launch takes: 32 windows). Each warp hashes one 1 MiB piece, so a bigger
  // batch does not lengthen the wait after the last copy (0.22-0.25 ms on an H100, 16 or 64 MiB).
  struct Batch {
    GpuDigestRanges ranges{};
    uint64_t bytes = 0;
    CUevent copied = nullptr;  // recorded after the copies of the batch's last window
  };
  static constexpr uint64_t kBatchBytes = 64ull << 20;
  // Adds window `window`'s jobs for `member` to the lane's `batch`, `copied` being the event
  // recorded after that window's copies to the member on the lane's copy stream (which ran the
  // batch's earlier windows' copies before them), and launches the batch on `stream` once full.
  // The member's context must be current.
  void add(Batch& batch, size_t window, size_t member, CUstream stream, CUevent copied) const;
  // Launches what `batch` holds on `stream`, behind its last window's copies.
  void launch(Batch& batch, size_t member, CUstream stream) const;
  // Once every stream the kernels ran on has been synchronised: each member's digests, into
  // `digests`. Throws MemberFailure for a member whose read-back fails.
  void collect(ContentDigests& digests) const;
  // Bytes the GPUs hash (FillControl::digestGpuBytes).
  uint64_t bytes() const { return bytes_; }
  // How long load() took (FillControl::digestGpuSetupSeconds).
  double setupSeconds() const { return setupSeconds_; }
  // Why some or all pieces are hashed on the CPU although they could be on the GPU; "" if none.
  const std::string& unavailable() const { return unavailable_; }

 private:
  struct Range {
    uint32_t first = 0;
    uint32_t count = 0;
    uint64_t bytes = 0;
  };
  struct Member {
    CUcontext context = nullptr;
    CUfunction kernel = nullptr;
    std::vector<size_t> pieces;  // per job: its piece in ContentDigests
    DeviceMemory jobs;           // GpuDigestJob per job, then `out`
    CUdeviceptr out = 0;         // 16 canonical bytes per job, inside `jobs`' allocation
  };
  Range jobsOf(size_t window, size_t member) const { return ranges_[window * members_.size() + member]; }
  void setUp(size_t m, const FillMember& member, const std::vector<GpuDigestJob>& jobs);

  const std::vector<FillMember>& fill_;
  ContentDigests& digests_;
  std::vector<Member> members_;
  std::vector<std::vector<GpuDigestJob>> jobs_;  // per member, until load() uploads them
  std::vector<Range> ranges_;                    // per window, per member
  uint64_t bytes_ = 0;
  double setupSeconds_ = 0;
  std::string unavailable_;
};

}  // namespace weightd
