#include "cuda_digests.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "cuda_digest_kernels.h"

namespace weightd {

namespace {

// Finds the kernel in the current context (cuda_digest_kernels.h) and uploads `jobs`, with room
// for their digests after them (16 bytes each; 32-byte jobs keep them aligned), in one allocation
// left in `table` for the caller to free, also when a step fails. A fill's job table is a few
// hundred KB (32 bytes per MiB): one synchronous copy from pageable memory, where pinning a buffer
// for it, as this did, cost more than the copy (the setup took 2.3-2.8 ms of an 8 GB fill on an
// H100, the module's load 0.3 of it: bench/gpu/results/2026-12-07-h100-digest-kernels-kept). Such a
// copy may return before its DMA has landed, and nothing orders the lanes' non-blocking streams
// after the legacy default stream it ran on, so that stream is waited for; no stream of the
// daemon's is a blocking one, so the wait holds up no other work.
void loadKernel(const std::vector<GpuDigestJob>& jobs, CUfunction& kernel, DeviceMemory& table, CUdeviceptr& out) {
  const CudaDriver& drv = cudaDriver();
  kernel = digestKernels().hash;
  const uint64_t tableBytes = jobs.size() * sizeof(GpuDigestJob);
  table = allocateDeviceMemory(tableBytes + jobs.size() * 16);
  out = table.get() + tableBytes;
  drv.cuMemcpyHtoD_v2(table.get(), jobs.data(), tableBytes);
  drv.cuStreamSynchronize(CU_STREAM_LEGACY);
}

// Launches the kernel over `ranges` of the job table on `stream`: one warp per job.
void launchKernel(CUfunction kernel, CUdeviceptr table, CUdeviceptr out, GpuDigestRanges& ranges, CUstream stream) {
  unsigned warps = 0;
  for (unsigned i = 0; i < ranges.n; ++i) warps += ranges.count[i];
  void* args[] = {&table, &ranges, &out};
  const unsigned warpsPerBlock = kGpuDigestBlockThreads / 32;
  cudaDriver().cuLaunchKernel(kernel, (warps + warpsPerBlock - 1) / warpsPerBlock, 1, 1, kGpuDigestBlockThreads, 1, 1, 0, stream, args, nullptr);
}

}  // namespace

const std::string& SegmentHasher::unavailable() { return digestKernelMissing(); }

SegmentHasher::SegmentHasher(ContentDigests& digests, size_t segments, const std::vector<SegmentCopy>& copies)
    : digests_(digests), of_(segments), copiedBy_(segments) {
  // Per segment, its copies by destination offset (they share no byte).
  std::vector<std::vector<const SegmentCopy*>> into(segments);
  for (const SegmentCopy& c : copies)
    if (c.segment < segments && c.bytes > 0) into[c.segment].push_back(&c);
  for (auto& list : into) std::sort(list.begin(), list.end(), [](const SegmentCopy* a, const SegmentCopy* b) { return a->dstOffset < b->dstOffset; });
  // Where the kernel can copy the piece at [start, start + bytes) of segment s from, else 0.
  auto copiedFrom = [&](uint32_t s, uint64_t start, uint64_t bytes) -> CUdeviceptr {
    const auto& list = into[s];
    auto it = std::upper_bound(list.begin(), list.end(), start, [](uint64_t v, const SegmentCopy* c) { return v < c->dstOffset; });
    if (it == list.begin()) return 0;
    const SegmentCopy& c = **(it - 1);
    if (start + bytes > c.dstOffset + c.bytes) return 0;
    const CUdeviceptr from = c.from + (start - c.dstOffset);
    return start % 8 == 0 && from % 8 == 0 ? from : 0;
  };
  for (uint32_t s = 0; s < segments; ++s) {
    of_[s].first = static_cast<uint32_t>(jobs_.size());
    digests.claimCovered(s, 0, UINT64_MAX, [&](size_t p) {
      const uint64_t start = digests.pieceStart(p), bytes = digests.pieceBytes(p);
      jobs_.push_back({start, bytes, jobs_.size(), 0});
      pieces_.push_back(p);
      from_.push_back(copiedFrom(s, start, bytes));
      if (from_.back() == 0) return;
      // Pieces come in order of offset: a piece that follows the last range extends it.
      auto& ranges = copiedBy_[s];
      if (!ranges.empty() && ranges.back().second == start) ranges.back().second = start + bytes;
      else ranges.emplace_back(start, start + bytes);
      bytesCopied_ += bytes;
    });
    of_[s].second = static_cast<uint32_t>(jobs_.size()) - of_[s].first;
  }
  if (jobs_.empty()) return;
  try {
    const DigestKernels kernels = digestKernels();
    moduleMs_ = kernels.loadMs;
    kernel_ = bytesCopied_ > 0 ? kernels.copy : kernels.hash;
    if (!kernel_) {
      // A kernel file built before the copying kernel existed: the copies are then all the driver's.
      kernel_ = kernels.hash;
      std::fill(from_.begin(), from_.end(), 0);
      for (auto& ranges : copiedBy_) ranges.clear();
      bytesCopied_ = 0;
    }
    table_ = allocateDeviceMemory(jobs_.size() * sizeof(GpuDigestJob));
    out_ = allocateDeviceMemory(jobs_.size() * 16);
    staging_ = allocatePinnedHost(jobs_.size() * sizeof(GpuDigestJob));
  } catch (...) {
    releaseAll();
    table_.reset();
    out_.reset();
    throw;
  }
}

SegmentHasher::~SegmentHasher() {
  table_.reset();
  out_.reset();
}

void SegmentHasher::launch(size_t from, size_t to, const CUdeviceptr* bases, CUstream stream) {
  if (from >= to) return;
  const uint32_t first = of_[from].first;
  const uint32_t count = of_[to - 1].first + of_[to - 1].second - first;
  if (count == 0) return;
  GpuDigestJob* staged = static_cast<GpuDigestJob*>(staging_.get());
  for (size_t s = from; s < to; ++s) {
    for (uint32_t j = of_[s].first; j < of_[s].first + of_[s].second; ++j) {
      staged[j] = from_[j] ? GpuDigestJob{from_[j], jobs_[j].bytes, jobs_[j].slot, bases[s] + jobs_[j].src}
                           : GpuDigestJob{bases[s] + jobs_[j].src, jobs_[j].bytes, jobs_[j].slot, 0};
    }
  }
  cudaDriver().cuMemcpyHtoDAsync_v2(table_.get() + first * sizeof(GpuDigestJob), staged + first, count * sizeof(GpuDigestJob), stream);
  // As many jobs per launch as its ranges count (a range's count is 32 bits).
  for (uint32_t done = 0; done < count;) {
    GpuDigestRanges ranges{};
    for (; ranges.n < kGpuDigestMaxRanges && done < count; ++ranges.n) {
      ranges.first[ranges.n] = first + done;
      ranges.count[ranges.n] = std::min<uint32_t>(count - done, 1u << 20);
      done += ranges.count[ranges.n];
    }
    launchKernel(kernel_, table_.get(), out_.get(), ranges, stream);
  }
}

void SegmentHasher::collect() {
  if (jobs_.empty()) return;
  std::vector<unsigned char> digestBytes(16 * jobs_.size());
  cudaDriver().cuMemcpyDtoH_v2(digestBytes.data(), out_.get(), digestBytes.size());
  for (size_t j = 0; j < pieces_.size(); ++j) digests_.setPieceDigest(pieces_[j], &digestBytes[16 * j]);
}

void SegmentHasher::releaseAll() {
  for (size_t p : pieces_) digests_.release(p);
}

std::string hashDeviceSegments(const std::vector<CUdeviceptr>& segments, const std::vector<uint64_t>& bytes, ContentDigests& digests) {
  (void)bytes;  // every piece lies in its segment's bytes (ContentDigests was made over them)
  if (!SegmentHasher::unavailable().empty()) return SegmentHasher::unavailable();
  std::unique_ptr<SegmentHasher> hasher;
  try {
    hasher = std::make_unique<SegmentHasher>(digests, segments.size());
    Stream stream = createStream();
    if (!segments.empty()) hasher->launch(0, segments.size(), segments.data(), stream.get());
    cudaDriver().cuStreamSynchronize(stream.get());
    hasher->collect();
  } catch (const DeviceError& e) {
    if (hasher) hasher->releaseAll();
    return e.what();
  }
  return "";
}

GpuDigests::GpuDigests(const std::vector<FillMember>& members, const std::vector<FillWindow>& windows, ContentDigests& digests)
    : fill_(members), digests_(digests), members_(members.size()), jobs_(members.size()), ranges_(windows.size() * members.size()) {
  if (digests.empty()) return;
  if (!digestKernelMissing().empty()) {
    unavailable_ = digestKernelMissing();
    return;
  }
  std::vector<std::vector<GpuDigestJob>>& jobs = jobs_;
  for (size_t w = 0; w < windows.size(); ++w) {
    const FillWindow& window = windows[w];
    for (const WindowPiece& piece : window.pieces) {
      const CopyOp& c = piece.copy;
      // A strided copy's rows are too short to hold a piece: those stay the CPU's.
      if (c.rows != 1) continue;
      std::vector<GpuDigestJob>& own = jobs[piece.member];
      Range& range = ranges_[w * members.size() + piece.member];
      if (range.count == 0) range.first = static_cast<uint32_t>(own.size());
      const CUdeviceptr base = members[piece.member].target.segmentBases[c.segment] + c.dstOffset;
      digests.claimCovered(window.file, c.srcOffset, c.srcOffset + c.rowBytes, [&](size_t p) {
        own.push_back({base + (digests.pieceStart(p) - c.srcOffset), digests.pieceBytes(p), own.size(), 0});
        members_[piece.member].pieces.push_back(p);
        ++range.count;
        range.bytes += digests.pieceBytes(p);
      });
    }
  }
}

void GpuDigests::load() {
  const auto started = std::chrono::steady_clock::now();
  const size_t n = fill_.size();
  for (size_t m = 0; m < n; ++m) {
    if (jobs_[m].empty()) continue;
    try {
      setUp(m, fill_[m], jobs_[m]);
    } catch (const DeviceError& e) {
      // This member's pieces go back to the CPU, which hashes them as the windows pass.
      unavailable_ += (unavailable_.empty() ? "" : "; ") + fill_[m].target.label + ": " + e.what();
      for (size_t p : members_[m].pieces) digests_.release(p);
      members_[m].pieces.clear();
      for (size_t w = 0; w < ranges_.size() / n; ++w) ranges_[w * n + m] = {};
      continue;
    }
    for (const GpuDigestJob& j : jobs_[m]) bytes_ += j.bytes;
    jobs_[m] = {};
  }
  setupSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void GpuDigests::setUp(size_t m, const FillMember& member, const std::vector<GpuDigestJob>& jobs) {
  Member& own = members_[m];
  ScopedContext current(member.target.context);
  own.context = member.target.context;
  loadKernel(jobs, own.kernel, own.jobs, own.out);
}

GpuDigests::~GpuDigests() {
  for (Member& m : members_) {
    if (!m.context) continue;
    ScopedContext current(m.context);
    m.jobs.reset();
  }
}

void GpuDigests::add(Batch& batch, size_t window, size_t member, CUstream stream, CUevent copied) const {
  const Range r = jobsOf(window, member);
  if (r.count == 0) return;
  GpuDigestRanges& ranges = batch.ranges;
  ranges.first[ranges.n] = r.first;
  ranges.count[ranges.n] = r.count;
  ++ranges.n;
  batch.bytes += r.bytes;
  batch.copied = copied;
  if (batch.bytes >= kBatchBytes || ranges.n == kGpuDigestMaxRanges) launch(batch, member, stream);
}

void GpuDigests::launch(Batch& batch, size_t member, CUstream stream) const {
  if (batch.ranges.n == 0) return;
  const Member& m = members_[member];
  cudaDriver().cuStreamWaitEvent(stream, batch.copied, 0);
  launchKernel(m.kernel, m.jobs.get(), m.out, batch.ranges, stream);
  batch = Batch{};
}

void GpuDigests::collect(ContentDigests& digests) const {
  for (size_t i = 0; i < members_.size(); ++i) {
    const Member& m = members_[i];
    if (m.pieces.empty()) continue;
    std::vector<unsigned char> out(16 * m.pieces.size());
    try {
      ScopedContext current(m.context);
      cudaDriver().cuMemcpyDtoH_v2(out.data(), m.out, out.size());
    } catch (const DeviceError& e) {
      throw MemberFailure(i, fill_[i].target, e);
    }
    for (size_t j = 0; j < m.pieces.size(); ++j) digests.setPieceDigest(m.pieces[j], &out[16 * j]);
  }
}

}  // namespace weightd
