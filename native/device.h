// The backend interface every device implements (host shared memory, CUDA). Plain C++ with no
// Node-API types, so fills can run on native threads and the bindings stay in one place.
#pragma once
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fill_records.h"

namespace weightd {

// An error with a stable code; the bindings turn it into a JS DeviceError.
class DeviceError : public std::runtime_error {
 public:
  DeviceError(std::string code, const std::string& message)
      : std::runtime_error(message), code_(std::move(code)) {}
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

struct DeviceInfo {
  std::string backend;  // "host" or "cuda"
  int index = 0;        // ordinal among visible devices
  std::string uuid;
  std::string name;
  uint64_t totalBytes = 0;
  uint64_t freeBytes = 0;
  // cuda: false while the device has no context (CudaDevice's deferContext), so freeBytes is
  // unknown (0), not measured.
  bool freeProbed = true;
};

// How the cuda backend moves file bytes to the device (the host backend always reads).
enum class FillMode {
  Pread,     // read into pinned staging buffers, then copy
  Register,  // mmap the file and pin (cuMemHostRegister) windows of it, then copy from them
};

// How a fill reads and how much it may hold. src/native/fillPolicy.ts decides every number (the
// bindings refuse a fill without them, fill_args.cpp); the backends only keep them within what
// their mechanics need.
struct FillOptions {
  // Reader threads. With a group, per GPU's worth of distinct bytes read: the engine scales it by
  // what the group reads (cuda_copy_engine.cpp), never past max(threads, CPUs).
  unsigned threads = 0;
  uint64_t chunkBytes = 0;    // unit of work handed to one reader thread
  uint64_t stagingBytes = 0;  // bound on pinned host memory (cuda); with a group, per GPU's worth
  // cuda: a group's scaled staging stays under max(stagingBytes, this), however many GPUs share it.
  uint64_t maxGroupStagingBytes = 0;
  bool direct = false;                  // O_DIRECT reads where the file system allows
  FillMode mode = FillMode::Pread;      // cuda only
  // Fills of one process naming the same group id, groupSize of them: on cuda they share one
  // pass over the files (cuda_fill_group.h), on the host the hashing of their digests
  // (host_digest_group.h). 0 or 1: this device fills alone.
  std::string groupId;
  unsigned groupSize = 0;
  // cuda only: hash digest pieces on the GPU where the addon has the kernel (cuda_digests.h);
  // false hashes every piece on the CPU (digestOn: 'cpu', to compare the two).
  bool gpuDigests = true;
};

// The control block of a running fill, shared with whoever watches it (fill_job.h): readers add
// bytes as they land; anyone may set cancel, and every reader checks it between work items.
// (What TypeScript calls FillProgress is a snapshot of it, made by polling.)
struct FillControl {
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> cancel{false};
  // Set while this fill waits for the other members of its group: cuda, for them to join
  // (cuda_fill_group.h); host, for them to finish their copies (host_digest_group.h). A rank
  // stuck here is waiting for another rank, not copying, and status says so.
  std::atomic<bool> waitingForGroup{false};
  // Written by the fill before it returns: the digest of each tensor range it was given
  // (content_digests.h), in order, read only once the fill is done.
  std::vector<std::string> digests;
  // Written with `digests`: the bytes of digest pieces that no read of the fill held whole, read
  // again at its end (ContentDigests::hashRest). 0 where the fill's reads cover every tensor, as
  // a tp=1 rank's or a whole node group's do; a regression in how reads are cut shows here.
  uint64_t digestRereadBytes = 0;
  // Host, in a digest group (host_digest_group.h's RowsPlan): bytes of row-parallel tensors'
  // columns this fill wrote into the other members' arenas, and bytes of its own that another
  // member wrote, so it did not read them.
  std::atomic<uint64_t> rowsDeliveredBytes{0};
  std::atomic<uint64_t> rowsReceivedBytes{0};
  // Written with `digests` (cuda): the bytes of digest pieces hashed on the GPU (a group's: on
  // all its GPUs), and why pieces the GPU could have hashed were hashed on the CPU ("" when none were).
  uint64_t digestGpuBytes = 0;
  std::string digestGpuUnavailable;
  // Written with `digests` (cuda, where the GPU hashes): seconds spent loading the digest kernel
  // and its jobs before the first read, and seconds the fill waited for the kernels after its last
  // copy landed. What the GPU digests add to a fill's time is about their sum.
  double digestGpuSetupSeconds = 0;
  double digestGpuTailSeconds = 0;
  // Written with `digests` (cuda, read through staging): seconds spent making the staging before
  // the first read, and whether it was the block the CUDA warm-up pinned ahead (pinned_stash.h).
  double stagingSeconds = 0;
  bool stagingPinnedAhead = false;
};

struct SegmentExport {
  uint32_t segment = 0;
  uint64_t bytes = 0;
  // host: "memfd" (the segment is `fd`). cuda: the legacy IPC handle, base64-encoded, or
  // "cuda-fd" (VMM memory, the segment is `fd`: cuda_vmm.h).
  std::string handle;
  // The segment's descriptor (host: sealed read-only), for SCM_RIGHTS; owned by the device (closed by
  // free()), so a sender dups nothing and must not close it. -1: the backend has none.
  int fd = -1;
};

inline uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Throws unless [offset, offset + length) lies inside segment `segment` of `segments` (any
// container of structs with a `bytes` member): the one bounds check every backend's read uses.
template <typename Segments>
void checkReadRange(const Segments& segments, uint32_t segment, uint64_t offset, uint64_t length) {
  uint64_t end;
  if (segment >= segments.size() || __builtin_add_overflow(offset, length, &end) || end > segments[segment].bytes) {
    throw DeviceError("E_OUT_OF_RANGE", "read of " + std::to_string(length) + " bytes at " + std::to_string(offset) +
                                            " is outside segment " + std::to_string(segment));
  }
}

// Throws E_BAD_PLAN unless every range lies inside its segment: checked before any byte moves.
template <typename Sizes>
void validateZeroRanges(const std::vector<ZeroRange>& zeros, const Sizes& segmentBytes) {
  for (size_t i = 0; i < zeros.size(); ++i) {
    const ZeroRange& z = zeros[i];
    uint64_t end;
    if (z.segment >= segmentBytes.size() || __builtin_add_overflow(z.offset, z.bytes, &end) || end > segmentBytes[z.segment]) {
      throw DeviceError("E_BAD_PLAN", "zero range " + std::to_string(i) + " (" + std::to_string(z.bytes) + " bytes at " +
                                          std::to_string(z.offset) + " of segment " + std::to_string(z.segment) +
                                          ") is outside the arena of " + std::to_string(segmentBytes.size()) + " segment(s)");
    }
  }
}

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceInfo info() = 0;
  // Reserves one allocation per segment. Fails before anything is copied if memory is short.
  virtual void allocate(const std::vector<uint64_t>& segmentBytes) = 0;
  // Runs on a native thread (never the JS thread). Throws DeviceError; honours control.cancel.
  // Every backend writes zeros over `zeros` (and only there, so the cost is the padding's), since
  // a fill may reuse an arena that an earlier fill or the allocator left non-zero. Every backend
  // digests each of `tensors` whole (content_digests.h), its bytes that no op copies included,
  // into control.digests.
  virtual void fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
                    const std::vector<ZeroRange>& zeros, const std::vector<TensorRange>& tensors, const FillOptions& options,
                    FillControl& control) = 0;
  // Seals the arena where the backend can (host: read-only memfds) and describes its segments.
  virtual std::vector<SegmentExport> exportSegments() = 0;
  // Takes an arena another process exported (one descriptor per segment, in order) instead of
  // allocate + fill. Owns the fds from the call on: they are closed by free(), or at once when
  // adopt fails, which maps nothing and names the segment at fault.
  virtual void adopt(const std::vector<int>& fds, const std::vector<uint64_t>& segmentBytes) = 0;
  // Checks what adopt() holds but has not checked yet (cuda with a deferred context: imports and
  // maps each descriptor). Nothing to do where adopt() checks everything itself (host).
  virtual void checkAdopted() {}
  // Copies bytes back out of the arena (verification and tests).
  virtual void read(uint32_t segment, uint64_t offset, uint64_t length, void* dst) = 0;
  // Frees every allocation and closes every descriptor. Idempotent; also called by the destructor.
  virtual void free() = 0;
};

}  // namespace weightd
