// The segments of a model version a writer fills on a cuda device served with --cuda-handles fd
// (docs/weight-updates.md, "cuda"). CUDA has no seal: memory a writer maps writable stays
// writable for as long as it maps it, whatever it promises. So the writer gets *staging*
// allocations, and at commit the daemon copies them (device to device) into *final* allocations
// that no writer is handed; only those are served. Clients map them read-only where the driver
// allows, but an importer of their descriptor could map them read-write: no seal stops it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "content_digests.h"
#include "cuda_resources.h"
#include "cuda_segment_digests.h"
#include "cuda_vmm.h"
#include "fill_records.h"

namespace weightd {

// A fresh VMM allocation on visible device `deviceIndex` big enough for a segment of `bytes`,
// holding a device-to-device copy of the allocation behind `sourceFd` (a served "cuda-fd"
// segment of that size). Returns its exported descriptor, the caller's to close: the descriptor
// is the daemon's only reference to the memory, which goes once it is closed and no process
// (the writer) maps it any more. E_OUT_OF_MEMORY names the bytes needed and free.
int cudaStagingCopy(int deviceIndex, int sourceFd, uint64_t bytes);

// A fresh staging allocation of `bytes` on visible device `deviceIndex`, its content undefined
// until written: what a writer fills from nothing (an engine's processed parameters, published
// beside a version; docs/engines.md). Returns its exported descriptor, as cudaStagingCopy does.
int cudaStagingFresh(int deviceIndex, uint64_t bytes);

struct PreparedMade {
  // The set's number (never 0), for cudaPullCopies, cudaPullCommit and cudaDropPrepared
  // (cuda_prepared_finals.h), which keeps the finals mapped in this process until dropped.
  uint32_t id = 0;
  // Per segment: the final's exported descriptor (the caller's to close), -1 where none was asked.
  std::vector<int> fds;
  double allocateMs = 0, totalMs = 0;
};

// A pull's finals made before its tensors are named (begin_update's "prepare"): a final allocation
// for each segment with `which` (sizes `bytes`) on visible device `deviceIndex`, judged against the
// GPU's free memory as the update's other allocations are (E_OUT_OF_MEMORY), made and mapped
// read-write in this process and kept mapped under the returned number, so the pull's copies
// neither make nor map them. On a failure nothing of it is left.
PreparedMade cudaPrepareFinals(int deviceIndex, const std::vector<bool>& which, const std::vector<uint64_t>& bytes);

struct CudaCommitted {
  // Per segment: the final allocation's descriptor (the caller's to close) where `copied`, else -1.
  std::vector<int> fds;
  // Each of `tensors`' digest, over the final segments and the shared ones.
  CudaDigests digested;
  // Where the commit's time went, in milliseconds (the daemon logs them: a same-GPU update is
  // held to a multiple of one device-to-device copy, issue 31): making the finals, opening a
  // pull's sources (0 for staging), the copies (queued and done), the digests.
  // mapMs: mapping the finals made earlier, the shared segments and the base's read for gaps;
  // totalMs: the whole call on its thread (what the caller's wall time adds is the thread pool's
  // queue and the hop back to JS).
  double allocateMs = 0, openMs = 0, mapMs = 0, copyMs = 0, digestMs = 0, totalMs = 0;
  // How many allocations the call mapped (finals made or imported, shared segments, the base's read for gaps).
  uint32_t mapped = 0;
};

// At commit: for each segment i with copied[i], a fresh final allocation holding a device-to-device
// copy of staging descriptor fds[i]; every other fds[i] is a served segment shared with the base.
// Then the digest of every tensor of `tensors` (indexing segments), over what the new version
// will serve (cuda_segment_digests.h; `onGpu` as there). Nothing of it stays on failure.
CudaCommitted cudaCommitCopies(int deviceIndex, const std::vector<int>& fds, const std::vector<bool>& copied,
                               const std::vector<uint64_t>& bytes, std::vector<TensorRange> tensors, unsigned threads, bool onGpu);

// A pull's commit (docs/weight-updates.md, "Pulling from the writer's tensors"): as
// cudaCommitCopies, but each final allocation is written by `copies` alone, straight from the
// writer's own memory: `sources` are legacy CUDA IPC handles (64 bytes each, of cudaMalloc'd
// memory of another process on this GPU), opened in the device's primary context, read by the
// copies with source k > 0, and closed once the copies are done, before the digests (which read
// only the finals, memory no other process maps). Source 0 is fds[segment], the base's segment,
// for the bytes between pulled tensors. A handle the driver will not open is E_UPDATE_SOURCE; a
// copy past the end of its source's allocation, E_UPDATE_SIZE. The writer must keep its memory
// allocated and unchanged until this returns: the driver does not keep an exporter's memory alive
// for an importer (freeing it while opened is undefined), so what was read is what the digests say.
//
// `finals` (empty, or one per segment): a final that cudaPullCopies made and wrote earlier, its
// descriptor duplicated into the result, and imported writable here only where a copy writes into
// it or one of `tensors` lies in it; -1 where the commit makes the final itself. Then `copies` need
// only fill what no pulled copy wrote (the gaps, from the base: source 0). `prepared` (0: none):
// the set cudaPrepareFinals made, whose finals are used where they are mapped, not mapped again.
//
// Both commits map a segment only for what they do to it: a final they make or copy into, a
// segment a copy reads, a segment one of `tensors` lies in. A segment shared with the base that
// none of these touches is served as it is, unmapped here.
CudaCommitted cudaPullCommit(int deviceIndex, const std::vector<int>& fds, const std::vector<bool>& copied, const std::vector<uint64_t>& bytes,
                             const std::vector<int>& finals, const std::vector<std::string>& sources, const std::vector<CommitCopy>& copies,
                             std::vector<TensorRange> tensors, unsigned threads, bool onGpu, uint32_t prepared);

struct CudaPulled {
  // Per segment: the final made by this call (its exported descriptor, the caller's), else -1.
  std::vector<int> fds;
  // Each of the call's `tensors`' digest, over what its copies wrote (empty when none was asked).
  CudaDigests digested;
  // releaseMs: handing what it holds (the finals it mapped, the writer's memory opened, the digests'
  // module and buffers, the streams) to the releaser's thread, which lets go of it after the call
  // answered (deferred_release.h).
  // setupMs: the digest kernel's module, its job table and buffers, the streams.
  double allocateMs = 0, openMs = 0, mapMs = 0, copyMs = 0, digestMs = 0, releaseMs = 0, setupMs = 0, totalMs = 0;
  // moduleMs: of setupMs, loading the digest kernel's module.
  double moduleMs = 0;
  // Bytes the digest kernel copied as it hashed them (the rest went through cuMemcpy).
  uint64_t copiedByKernelBytes = 0;
};

class PreparedFinals;
class SegmentHasher;

// The writer's memory behind one pulled IPC handle, opened, and how many bytes of its allocation
// lie from the handle's address on.
struct PulledSource {
  IpcMapping mapping;
  uint64_t bytes = 0;
};

// What a pull's copies need besides the finals they write: the writer's memory opened, the copies
// checked and sorted by segment, the zeros, and for the digests of the tensors they write whole
// the digest kernel's module, job table and buffers, with the streams. Making it is most of a
// pull's fixed cost (on an H100, 1.5-2.2 ms of setup for 83 segments and 0.3-5.5 ms of opens for
// 1-123 allocations, bench/RESULTS.md 2026-12-07), the same for every update of a trainer whose
// parameters stay where they are: cudaPullCopies makes one per call and lets go of it after it
// answered; a pull plan (cuda_pull_plans.h) keeps one for as many updates as its writer runs.
// Made, run and destroyed with device `deviceIndex`'s primary context current; one run at a time.
class PullWork {
 public:
  // Checks and opens as cudaPullCopies says (E_BAD_PLAN, E_UPDATE_SOURCE, E_UPDATE_SIZE); where the
  // kernel cannot hash here, says why in gpuDigestUnavailable() and hashes on the CPU at each run.
  PullWork(int deviceIndex, std::vector<bool> writes, std::vector<uint64_t> bytes, const std::vector<std::string>& sources, std::vector<CommitCopy> copies,
           std::vector<ZeroRange> zeros, std::vector<TensorRange> tensors, bool onGpu);
  ~PullWork();
  PullWork(const PullWork&) = delete;
  PullWork& operator=(const PullWork&) = delete;

  // What one run made or mapped (the finals' mappings, its events), drained: its caller lets go of
  // them after answering (deferred_release.h).
  struct Held {
    std::vector<VmmSegment> into;
    std::vector<Event> copied;
  };
  // One pull's copies (and digests) into the finals, as cudaPullCopies says: `finals` one per
  // segment (-1: made here), `kept` the prepared set where one is (else null). Fills every field of
  // the result but openMs, setupMs, moduleMs and releaseMs. On a failure the streams are drained
  // before anything of the run goes, and the work stays usable for another run.
  CudaPulled run(const std::vector<int>& finals, const PreparedFinals* kept, unsigned threads, Held& held);

  size_t segments() const { return bytes_.size(); }
  int deviceIndex() const { return deviceIndex_; }
  double openMs() const { return openMs_; }
  double setupMs() const { return setupMs_; }
  double moduleMs() const;
  uint64_t copiedByKernelBytes() const;
  const std::string& gpuDigestUnavailable() const { return gpuDigestUnavailable_; }

 private:
  int deviceIndex_;
  CUdevice dev_;
  std::vector<bool> writes_;
  std::vector<uint64_t> bytes_;
  std::vector<CommitCopy> copies_;
  std::vector<ZeroRange> zeros_;
  std::vector<std::vector<const CommitCopy*>> bySegment_;
  std::vector<std::vector<const ZeroRange*>> zerosOf_;
  std::vector<TensorRange> tensors_;
  std::string gpuDigestUnavailable_;
  double openMs_ = 0, setupMs_ = 0;
  // Declared in this order so that they go in the reverse: the streams drained first, then the
  // kernel's buffers a queued launch uses, then the writer's memory a queued copy reads, then the
  // digests the kernel's results went into.
  std::unique_ptr<ContentDigests> digests_;
  std::vector<PulledSource> pulled_;
  std::unique_ptr<SegmentHasher> hasher_;
  Stream stream_, hashing_;
};

// Hands `release` to the releaser's thread (deferred_release.h), which runs it, and lets go of
// what it captured, with visible device `deviceIndex`'s primary context current, after every
// release handed over before it. What a pull held (the streams drained, the finals' mappings, the
// writer's memory opened, the kernel's buffers) goes so, after its call answered. Returns the ms
// the hand-over took (a pull's releaseMs).
double releaseInContext(int deviceIndex, std::function<void()> release);

// A pull's copies run early, as pull_tensors names the tensors (the writer keeps them unchanged
// until the commit's reply): for each segment with `writes`, the final is made here where
// `finals[segment]` is -1 (fresh memory, judged against the GPU's free memory under the
// allocation lock, E_OUT_OF_MEMORY; its exported descriptor returned, handed to no one), else
// that earlier final is mapped writable for the call; then the segment's `copies` are queued at
// once (sources k > 0 only: the k-th of `sources`, opened once for the call and closed right after
// it returns, on the releaser's thread), so the GPU copies one segment while the next is made. Returns once every copy is done.
// The finals stay invisible until a commit serves them. E_UPDATE_SOURCE, E_UPDATE_SIZE as
// cudaPullCommit's; on any failure nothing made here is left.
//
// Then the digest of each of `tensors` (`file` indexing the segments; each within a segment this
// call writes, else E_BAD_PLAN), over the finals while they are mapped here (`onGpu` and `threads`
// as digestDeviceSegments'): the caller passes the tensors this call wrote whole and that share no
// byte with another tensor, whose bytes nothing after it changes, so the commit neither hashes
// them again nor maps a final that only they fill.
//
// `zeros`: bytes of the written segments that no tensor holds (alignment and padding), written as
// zeros into each written segment's final with its copies, so that a commit need not copy the
// base's over them (a full pull's commit then maps no final at all).
//
// `prepared` (0: none): the set cudaPrepareFinals made; where it holds a segment's final (also
// given in `finals`), the copies go straight into its mapping.
CudaPulled cudaPullCopies(int deviceIndex, const std::vector<int>& finals, const std::vector<bool>& writes, const std::vector<uint64_t>& bytes,
                          const std::vector<std::string>& sources, const std::vector<CommitCopy>& copies, const std::vector<ZeroRange>& zeros,
                          std::vector<TensorRange> tensors, unsigned threads, bool onGpu, uint32_t prepared);

}  // namespace weightd
