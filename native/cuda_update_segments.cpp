#include "cuda_update_segments.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>

#include "content_digests.h"
#include "cuda_digests.h"
#include "cuda_prepared_finals.h"
#include "cuda_resources.h"
#include "cuda_vmm.h"
#include "deferred_release.h"
#include "unix_fds.h"

namespace weightd {

namespace {

// While a pull's finals are still being made, its digests are hashed a batch of segments of at
// least this many bytes at a time (one launch: a warp per 1 MiB piece, about a thousand warps),
// behind the copies of those segments, while the next ones are made. Once no final is left to
// make (all prepared, or the last made), the rest is one launch: nothing on the host is left to
// overlap, and a launch of a thousand warps leaves each SM a few warps' loads in flight.
constexpr uint64_t kHashBatchBytes = 1ull << 30;

// One allocation of an update at a time, so allocations made at once (several segments, several
// ranks on one GPU) are each judged against what the ones before them took, not all against the
// same free figure.
std::mutex allocating;

void checkFree(int deviceIndex, uint64_t needed, const std::string& what) {
  size_t freeBytes = 0, totalBytes = 0;
  cudaDriver().cuMemGetInfo_v2(&freeBytes, &totalBytes);
  if (needed > freeBytes) {
    throw DeviceError("E_OUT_OF_MEMORY", what + " needs " + std::to_string(needed) + " bytes on GPU " + std::to_string(deviceIndex) + " but only " +
                                             std::to_string(freeBytes) + " bytes are free; free GPU memory (unload a model, or lower --keep-versions) " +
                                             "or name fewer tensors in begin_update");
  }
}

// The descriptor a segment exported, duplicated: the segment closes its own when it goes, so the
// caller's copy is then the daemon's only reference to the memory.
int dupExported(VmmSegment& segment) { return dupFd(segment.exportFd()); }

// A staging allocation of `size` bytes (a whole number of the device's granules) on the current
// context's device, judged against the GPU's free memory under the allocation lock.
VmmSegment stagingSegment(int deviceIndex, CUdevice dev, uint64_t size, const std::string& what) {
  std::lock_guard<std::mutex> hold(allocating);
  checkFree(deviceIndex, size, what);
  return VmmSegment::create(dev, size);
}

}  // namespace

int cudaStagingFresh(int deviceIndex, uint64_t bytes) {
  if (bytes == 0) throw DeviceError("E_BAD_PLAN", "a segment of zero bytes cannot be made");
  PrimaryContext context(deviceIndex);
  ScopedContext current(context.get());
  CUdevice dev = cudaDeviceAt(deviceIndex);
  VmmSegment staging = stagingSegment(deviceIndex, dev, vmmSegmentSize(dev, bytes), "a fresh writable segment of " + std::to_string(bytes) + " bytes");
  return dupExported(staging);
}

int cudaStagingCopy(int deviceIndex, int sourceFd, uint64_t bytes) {
  if (bytes == 0) throw DeviceError("E_BAD_PLAN", "a segment of zero bytes cannot be copied");
  PrimaryContext context(deviceIndex);
  ScopedContext current(context.get());
  CUdevice dev = cudaDeviceAt(deviceIndex);
  uint64_t size = vmmSegmentSize(dev, bytes);
  VmmSegment staging = stagingSegment(deviceIndex, dev, size, "a writable copy of a segment of " + std::to_string(bytes) + " bytes");
  VmmSegment source = VmmSegment::import(dev, sourceFd, size);
  Stream stream = createStream();
  cudaDriver().cuMemcpyDtoDAsync_v2(staging.pointer(), source.pointer(), size, stream.get());
  cudaDriver().cuStreamSynchronize(stream.get());
  return dupExported(staging);
}

namespace {

// fdAt(0..n-1), each a descriptor the caller owns or -1; if one throws, those made before it are
// closed, so a failed commit or pull hands out none.
template <class FdAt>
std::vector<int> descriptorsOrNone(size_t n, FdAt fdAt) {
  std::vector<int> fds;
  try {
    for (size_t i = 0; i < n; ++i) fds.push_back(fdAt(i));
  } catch (...) {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    throw;
  }
  return fds;
}

double msSince(std::chrono::steady_clock::time_point t) { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count(); }

PulledSource openPulledSource(const std::string& raw, size_t k, int deviceIndex) {
  CUipcMemHandle handle{};
  if (raw.size() != sizeof handle.reserved) {
    throw DeviceError("E_BAD_HANDLE", "pulled source " + std::to_string(k) + " is " + std::to_string(raw.size()) + " bytes, not the " +
                                          std::to_string(sizeof handle.reserved) + " of a CUDA IPC handle");
  }
  memcpy(handle.reserved, raw.data(), raw.size());
  const CudaDriver& drv = cudaDriver();
  CUdeviceptr p = 0;
  // The flag is the only one the driver documents for this call; a handle of another GPU would be
  // opened over peer access, which begin_update's device check keeps writers from asking for.
  CUresult r = drv.cuIpcOpenMemHandle_v2.raw(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) {
    DeviceError why = cudaError("cuIpcOpenMemHandle", r);
    throw DeviceError("E_UPDATE_SOURCE", "pulled source " + std::to_string(k) + " does not open on GPU " + std::to_string(deviceIndex) + " (" + why.what() +
                                             "): it must be a live cudaMalloc allocation of the writer's process on this GPU, exported with cuIpcGetMemHandle " +
                                             "(memory of torch's expandable segments or of cuMemCreate has no such handle: write it through the staging path)");
  }
  PulledSource out{IpcMapping(p), 0};
  CUdeviceptr base = 0;
  size_t size = 0;
  drv.cuMemGetAddressRange_v2(&base, &size, p);
  out.bytes = base + size - p;
  return out;
}

const std::vector<std::pair<uint64_t, uint64_t>> kNoRanges;

// Calls gap(a, b) for each stretch of [start, end) that none of `ranges` (sorted, disjoint
// [start, end) pairs) covers, in order.
template <class Gap>
void forEachGap(const std::vector<std::pair<uint64_t, uint64_t>>& ranges, uint64_t start, uint64_t end, Gap gap) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), start, [](uint64_t v, const std::pair<uint64_t, uint64_t>& r) { return v < r.second; });
  uint64_t at = start;
  for (; it != ranges.end() && it->first < end; ++it) {
    if (it->first > at) gap(at, it->first);
    at = std::max(at, it->second);
  }
  if (at < end) gap(at, end);
}

// Refuses a pulled copy that ends past the allocation its source opened.
void checkPulledRanges(const std::vector<PulledSource>& pulled, const std::vector<CommitCopy>& copies) {
  for (const CommitCopy& c : copies) {
    uint64_t end;
    if (c.source == 0) continue;
    const PulledSource& from = pulled[c.source - 1];
    if (__builtin_add_overflow(c.srcOffset, c.bytes, &end) || end > from.bytes) {
      throw DeviceError("E_UPDATE_SIZE", "a pulled copy of " + std::to_string(c.bytes) + " bytes at offset " + std::to_string(c.srcOffset) + " of source " +
                                             std::to_string(c.source - 1) + " ends past its allocation, which holds " + std::to_string(from.bytes) +
                                             " bytes from the handle's address on; pull each tensor from the memory that holds it whole");
    }
  }
}

// Opens each pulled source, checks every pulled copy against the allocation it opened, and runs
// `copies` into `into` (per segment: where to write; 0 where a copy may not go), reading source 0
// from `own` (per segment) and source k > 0 from the k-th pulled source; returns once they are
// done, the sources closed. The stream is declared after the sources, so that on a failure it is
// drained (its destructor) before any source a queued copy reads is closed.
void runCopies(int deviceIndex, const std::vector<CUdeviceptr>& into, const std::vector<CUdeviceptr>& own, const std::vector<std::string>& sources,
               const std::vector<CommitCopy>& copies, double& openMs, double& copyMs) {
  std::vector<PulledSource> pulled;
  auto t = std::chrono::steady_clock::now();
  for (size_t k = 0; k < sources.size(); ++k) pulled.push_back(openPulledSource(sources[k], k, deviceIndex));
  openMs += msSince(t);
  t = std::chrono::steady_clock::now();
  checkPulledRanges(pulled, copies);
  Stream stream = createStream();
  for (const CommitCopy& c : copies) {
    if (c.bytes == 0) continue;
    CUdeviceptr from = c.source == 0 ? own[c.segment] : pulled[c.source - 1].mapping.get();
    cudaDriver().cuMemcpyDtoDAsync_v2(into[c.segment] + c.dstOffset, from + c.srcOffset, c.bytes, stream.get());
  }
  cudaDriver().cuStreamSynchronize(stream.get());
  copyMs += msSince(t);
}

// Refuses copies that do not fit the commit: a segment outside it or not written (`writable`), a
// source it does not have (sources.size() pulled ones, and 0 unless `gapsAllowed` is false), a
// range past the segment's bytes.
// Whether `length` bytes from `start` lie in segment `segment` (`bytes` each), and, where `written`
// is given, in a segment it marks.
bool inSegments(uint64_t segment, uint64_t start, uint64_t length, const std::vector<uint64_t>& bytes, const std::vector<bool>& written) {
  uint64_t end;
  return segment < bytes.size() && (written.empty() || (segment < written.size() && written[segment])) && !__builtin_add_overflow(start, length, &end) &&
         end <= bytes[segment];
}

void checkCopies(const std::vector<CommitCopy>& copies, const std::vector<bool>& writable, const std::vector<uint64_t>& bytes, size_t sources,
                 bool gapsAllowed) {
  for (const CommitCopy& c : copies) {
    if (writable.empty() || !inSegments(c.segment, c.dstOffset, c.bytes, bytes, writable) || c.source > sources || (c.source == 0 && !gapsAllowed)) {
      throw DeviceError("E_BAD_PLAN", "a commit copy of " + std::to_string(c.bytes) + " bytes to segment " + std::to_string(c.segment) + " at " +
                                          std::to_string(c.dstOffset) + " from source " + std::to_string(c.source) + " lies outside the commit");
    }
  }
}

// Refuses tensors to digest that lie outside the segments (`bytes`), or, where `written` is given,
// outside the segments it marks: their memory is not mapped for the digests.
void checkTensors(const std::vector<TensorRange>& tensors, const std::vector<uint64_t>& bytes, const std::vector<bool>& written, const std::string& what) {
  for (const TensorRange& t : tensors) {
    if (t.start > t.end || !inSegments(t.file, t.start, t.end - t.start, bytes, written)) {
      throw DeviceError("E_BAD_PLAN", what + "'s tensor of bytes " + std::to_string(t.start) + "-" + std::to_string(t.end) + " of segment " + std::to_string(t.file) +
                                          " lies outside the segments it " + (written.empty() ? "has" : "writes"));
    }
  }
}

// The commit's shared body: finals for the copied segments (made here, or imported from `finals`
// where cudaPullCopies made and wrote one earlier), `copies` into them (sources as
// cudaPullCommit's; none for a staging commit), then the digests over what the version serves.
CudaCommitted commitInto(int deviceIndex, const std::vector<int>& fds, const std::vector<bool>& copied, const std::vector<uint64_t>& bytes,
                         const std::vector<int>& finals, const std::vector<std::string>& sources, const std::vector<CommitCopy>& copies,
                         std::vector<TensorRange> tensors, unsigned threads, bool onGpu, uint32_t prepared) {
  if (fds.size() != copied.size() || fds.size() != bytes.size() || (!finals.empty() && finals.size() != fds.size())) {
    throw DeviceError("E_BAD_PLAN", "a commit takes one descriptor, copied flag, size (and final, where given) per segment");
  }
  auto began = std::chrono::steady_clock::now();
  std::shared_ptr<const PreparedFinals> kept = preparedFinals(prepared, deviceIndex, fds.size());
  PrimaryContext context(deviceIndex);
  ScopedContext current(context.get());
  CUdevice dev = cudaDeviceAt(deviceIndex);
  auto made = [&](size_t i) { return !finals.empty() && finals[i] >= 0; };
  std::vector<uint64_t> sizes;
  uint64_t needed = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    sizes.push_back(vmmSegmentSize(dev, bytes[i]));
    if (copied[i] && !made(i)) needed += sizes.back();
  }
  checkCopies(copies, copied, bytes, sources.size(), true);
  checkTensors(tensors, bytes, {}, "a commit");
  // Which copied segments' own descriptors a copy reads (staging: all; a pull: those with gaps),
  // and which segments must be mapped at all: those a copy writes, those a tensor to digest lies in.
  std::vector<bool> readsOwn(fds.size(), false), mapped(fds.size(), false);
  for (const CommitCopy& c : copies) {
    if (c.source == 0) readsOwn[c.segment] = true;
    if (c.bytes > 0) mapped[c.segment] = true;
  }
  for (const TensorRange& t : tensors) mapped[t.file] = true;
  // What the new version serves: final allocations for the written segments, which only this
  // process ever maps (and writes, here or in cudaPullCopies), and the shared segments as they are.
  CudaCommitted out;
  auto t = std::chrono::steady_clock::now();
  std::vector<VmmSegment> served(fds.size());
  if (needed > 0) {
    std::lock_guard<std::mutex> hold(allocating);
    checkFree(deviceIndex, needed, "committing the update's " + std::to_string(std::count(copied.begin(), copied.end(), true)) + " written segment(s)");
    for (size_t i = 0; i < fds.size(); ++i)
      if (copied[i] && !made(i)) served[i] = VmmSegment::create(dev, sizes[i]);
  }
  out.allocateMs = msSince(t);
  t = std::chrono::steady_clock::now();
  // A final prepared at begin is mapped already (`preparedAt`); any other made earlier is mapped here.
  std::vector<CUdeviceptr> preparedAt(fds.size(), 0);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!copied[i] || !made(i) || !mapped[i]) continue;
    if (kept && kept->pointer(i)) preparedAt[i] = kept->pointer(i);
    else served[i] = VmmSegment::importWritable(dev, finals[i], sizes[i]);
  }
  {
    std::vector<VmmSegment> own(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!copied[i]) {
        if (mapped[i]) served[i] = VmmSegment::import(dev, fds[i], sizes[i]);
      } else if (readsOwn[i]) {
        own[i] = VmmSegment::import(dev, fds[i], sizes[i]);
      }
    }
    out.mapMs = msSince(t);
    for (size_t i = 0; i < fds.size(); ++i) out.mapped += (served[i].pointer() != 0) + (own[i].pointer() != 0);
    std::vector<CUdeviceptr> into, from;
    for (size_t i = 0; i < fds.size(); ++i) {
      into.push_back(!copied[i] ? 0 : preparedAt[i] ? preparedAt[i] : served[i].pointer());
      from.push_back(own[i].pointer());
    }
    runCopies(deviceIndex, into, from, sources, copies, out.openMs, out.copyMs);
  }
  std::vector<CUdeviceptr> pointers;
  for (size_t i = 0; i < served.size(); ++i) pointers.push_back(preparedAt[i] ? preparedAt[i] : served[i].pointer());
  t = std::chrono::steady_clock::now();
  out.digested = digestDeviceSegments(pointers, bytes, std::move(tensors), threads, onGpu);
  out.digestMs = msSince(t);
  out.fds = descriptorsOrNone(fds.size(), [&](size_t i) { return !copied[i] ? -1 : made(i) ? dupFd(finals[i]) : dupExported(served[i]); });
  out.totalMs = msSince(began);
  return out;
}

}  // namespace

PreparedMade cudaPrepareFinals(int deviceIndex, const std::vector<bool>& which, const std::vector<uint64_t>& bytes) {
  if (which.size() != bytes.size()) throw DeviceError("E_BAD_PLAN", "prepared finals take one flag and size per segment");
  auto began = std::chrono::steady_clock::now();
  PrimaryContext context(deviceIndex);
  ScopedContext current(context.get());
  CUdevice dev = cudaDeviceAt(deviceIndex);
  std::vector<uint64_t> sizes;
  uint64_t needed = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    sizes.push_back(which[i] ? vmmSegmentSize(dev, bytes[i]) : 0);
    needed += sizes.back();
  }
  std::vector<VmmSegment> made(bytes.size());
  {
    std::lock_guard<std::mutex> hold(allocating);
    checkFree(deviceIndex, needed, "preparing the pull's " + std::to_string(std::count(which.begin(), which.end(), true)) + " final segment(s)");
    for (size_t i = 0; i < bytes.size(); ++i)
      if (which[i]) made[i] = VmmSegment::create(dev, sizes[i]);
  }
  PreparedMade out;
  out.allocateMs = msSince(began);
  out.fds = descriptorsOrNone(made.size(), [&](size_t i) { return made[i].pointer() ? dupExported(made[i]) : -1; });
  try {
    out.id = keepPrepared(deviceIndex, std::move(made));
  } catch (...) {
    for (int fd : out.fds)
      if (fd >= 0) ::close(fd);
    throw;
  }
  out.totalMs = msSince(began);
  return out;
}

CudaCommitted cudaCommitCopies(int deviceIndex, const std::vector<int>& fds, const std::vector<bool>& copied,
                               const std::vector<uint64_t>& bytes, std::vector<TensorRange> tensors, unsigned threads, bool onGpu) {
  // Each staging allocation's segment bytes (every tensor lies in them), from source 0: the staging itself.
  std::vector<CommitCopy> copies;
  for (size_t i = 0; i < copied.size() && i < bytes.size(); ++i)
    if (copied[i]) copies.push_back(CommitCopy{static_cast<uint32_t>(i), 0, 0, 0, bytes[i]});
  return commitInto(deviceIndex, fds, copied, bytes, {}, {}, copies, std::move(tensors), threads, onGpu, 0);
}

CudaCommitted cudaPullCommit(int deviceIndex, const std::vector<int>& fds, const std::vector<bool>& copied, const std::vector<uint64_t>& bytes,
                             const std::vector<int>& finals, const std::vector<std::string>& sources, const std::vector<CommitCopy>& copies,
                             std::vector<TensorRange> tensors, unsigned threads, bool onGpu, uint32_t prepared) {
  return commitInto(deviceIndex, fds, copied, bytes, finals, sources, copies, std::move(tensors), threads, onGpu, prepared);
}

PullWork::PullWork(int deviceIndex, std::vector<bool> writes, std::vector<uint64_t> bytes, const std::vector<std::string>& sources, std::vector<CommitCopy> copies,
                   std::vector<ZeroRange> zeros, std::vector<TensorRange> tensors, bool onGpu)
    : deviceIndex_(deviceIndex),
      dev_(cudaDeviceAt(deviceIndex)),
      writes_(std::move(writes)),
      bytes_(std::move(bytes)),
      copies_(std::move(copies)),
      zeros_(std::move(zeros)),
      bySegment_(bytes_.size()),
      zerosOf_(bytes_.size()),
      tensors_(std::move(tensors)) {
  if (writes_.size() != bytes_.size()) throw DeviceError("E_BAD_PLAN", "pulled copies take one written flag and size per segment");
  // Pulled sources only: the other tensors' bytes come from the base at commit, once every tensor is named.
  checkCopies(copies_, writes_, bytes_, sources.size(), false);
  checkTensors(tensors_, bytes_, writes_, "a pull");
  for (const CommitCopy& c : copies_) bySegment_[c.segment].push_back(&c);
  for (const ZeroRange& z : zeros_) {
    if (!inSegments(z.segment, z.offset, z.bytes, bytes_, writes_)) {
      throw DeviceError("E_BAD_PLAN", "a pull's zero range of " + std::to_string(z.bytes) + " bytes at " + std::to_string(z.offset) + " of segment " +
                                          std::to_string(z.segment) + " lies outside the segments it writes");
    }
    zerosOf_[z.segment].push_back(&z);
  }
  digests_ = std::make_unique<ContentDigests>(tensors_, bytes_);
  auto t = std::chrono::steady_clock::now();
  for (size_t k = 0; k < sources.size(); ++k) pulled_.push_back(openPulledSource(sources[k], k, deviceIndex));
  openMs_ = msSince(t);
  checkPulledRanges(pulled_, copies_);
  // The digests: on the GPU, the pieces of a batch of segments (kHashBatchBytes) hashed on a stream
  // of their own behind those segments' copies, while the next segments are made and copied; else
  // (digestOn 'cpu', no kernel, its setup failed) read back at the end of each run. A launch per
  // segment (~100 warps for 100 MiB) left the GPU nearly idle: on an H100, 83 of them took 16 ms
  // after the copies where one launch over 8 GB takes 5 ms. The kernel also makes the copies of
  // the pieces that lie whole in one (SegmentHasher): on an H100 the copies with the kernel beside
  // them took 8.3 ms where the copies alone take 5.5, both bound by memory bandwidth and the
  // kernel reading again what the copies had just written.
  t = std::chrono::steady_clock::now();
  if (onGpu && !digests_->empty()) {
    gpuDigestUnavailable_ = SegmentHasher::unavailable();
    if (gpuDigestUnavailable_.empty()) {
      std::vector<SegmentCopy> fusable;
      for (const CommitCopy& c : copies_) fusable.push_back({c.segment, c.dstOffset, c.bytes, pulled_[c.source - 1].mapping.get() + c.srcOffset});
      try {
        hasher_ = std::make_unique<SegmentHasher>(*digests_, bytes_.size(), fusable);
      } catch (const DeviceError& e) {
        gpuDigestUnavailable_ = e.what();
      }
    }
  }
  stream_ = createStream();
  if (hasher_) hashing_ = createStream();
  setupMs_ = msSince(t);
}

PullWork::~PullWork() = default;

double PullWork::moduleMs() const { return hasher_ ? hasher_->moduleMs() : 0; }

uint64_t PullWork::copiedByKernelBytes() const { return hasher_ ? hasher_->bytesCopiedByKernel() : 0; }

CudaPulled PullWork::run(const std::vector<int>& finals, const PreparedFinals* kept, unsigned threads, Held& held) {
  if (finals.size() != bytes_.size()) throw DeviceError("E_BAD_PLAN", "pulled copies take one final descriptor (or -1) per segment");
  auto began = std::chrono::steady_clock::now();
  CudaPulled out;
  out.digested.gpuDigestUnavailable = gpuDigestUnavailable_;
  out.copiedByKernelBytes = copiedByKernelBytes();
  std::vector<CUdeviceptr> bases(finals.size(), 0);
  held.into.resize(finals.size());
  try {
    size_t batchFrom = 0;
    uint64_t batchBytes = 0;
    // Hashes segments [batchFrom, to) behind the copies queued so far.
    auto hashBatch = [&](size_t to) {
      if (!hasher_ || to == batchFrom) return;
      held.copied.push_back(createEvent());
      cudaDriver().cuEventRecord(held.copied.back().get(), stream_.get());
      cudaDriver().cuStreamWaitEvent(hashing_.get(), held.copied.back().get(), 0);
      hasher_->launch(batchFrom, to, bases.data(), hashing_.get());
      batchFrom = to;
      batchBytes = 0;
    };
    // The last segment whose final this run makes (allocates or maps): past it, no batch is cut.
    size_t lastMade = 0;
    for (size_t i = 0; i < finals.size(); ++i)
      if (writes_[i] && !(finals[i] >= 0 && kept && kept->pointer(i))) lastMade = i + 1;
    auto copying = std::chrono::steady_clock::now();
    double madeMs = 0;
    // Segment by segment: each one's copies are queued as soon as it is made (or mapped), so the GPU
    // copies one segment while the next is allocated.
    for (size_t i = 0; i < finals.size(); ++i) {
      if (!writes_[i]) continue;
      auto t = std::chrono::steady_clock::now();
      uint64_t size = vmmSegmentSize(dev_, bytes_[i]);
      if (finals[i] < 0) {
        std::lock_guard<std::mutex> hold(allocating);
        checkFree(deviceIndex_, size, "a final allocation of a pulled segment of " + std::to_string(bytes_[i]) + " bytes");
        held.into[i] = VmmSegment::create(dev_, size);
        out.allocateMs += msSince(t);
        bases[i] = held.into[i].pointer();
      } else if (kept && kept->pointer(i)) {
        bases[i] = kept->pointer(i);  // prepared at begin: mapped already
      } else {
        held.into[i] = VmmSegment::importWritable(dev_, finals[i], size);
        out.mapMs += msSince(t);
        bases[i] = held.into[i].pointer();
      }
      madeMs += msSince(t);
      for (const CommitCopy* c : bySegment_[i]) {
        const CUdeviceptr from = pulled_[c->source - 1].mapping.get() + c->srcOffset;
        // What the kernel does not copy as it hashes.
        forEachGap(hasher_ ? hasher_->copiedByKernel(i) : kNoRanges, c->dstOffset, c->dstOffset + c->bytes, [&](uint64_t a, uint64_t b) {
          cudaDriver().cuMemcpyDtoDAsync_v2(bases[i] + a, from + (a - c->dstOffset), b - a, stream_.get());
        });
      }
      for (const ZeroRange* z : zerosOf_[i])
        if (z->bytes > 0) cudaDriver().cuMemsetD8Async(bases[i] + z->offset, 0, z->bytes, stream_.get());
      batchBytes += bytes_[i];
      if (batchBytes >= kHashBatchBytes && i + 1 < lastMade) hashBatch(i + 1);
    }
    hashBatch(finals.size());
    cudaDriver().cuStreamSynchronize(stream_.get());
    if (hasher_) cudaDriver().cuStreamSynchronize(hashing_.get());
    // With the hasher, the tail of the digests is in this wait too: the kernels ran behind the copies.
    out.copyMs = msSince(copying) - madeMs;
    auto t = std::chrono::steady_clock::now();
    if (hasher_) {
      hasher_->collect();
      out.digested.digests = digests_->tensorDigests();
      out.digested.onGpu = true;
    } else if (!tensors_.empty()) {
      std::string why = std::move(out.digested.gpuDigestUnavailable);
      out.digested = digestDeviceSegments(bases, bytes_, tensors_, threads, false);
      out.digested.gpuDigestUnavailable = std::move(why);
    }
    out.digestMs = msSince(t);
    out.fds = descriptorsOrNone(finals.size(), [&](size_t i) { return writes_[i] && finals[i] < 0 ? dupExported(held.into[i]) : -1; });
  } catch (...) {
    // Nothing of the run may go while a queued copy or kernel still uses it.
    cudaDriver().cuStreamSynchronize.raw(stream_.get());
    if (hasher_) cudaDriver().cuStreamSynchronize.raw(hashing_.get());
    throw;
  }
  out.totalMs = msSince(began);
  return out;
}

CudaPulled cudaPullCopies(int deviceIndex, const std::vector<int>& finals, const std::vector<bool>& writes, const std::vector<uint64_t>& bytes,
                          const std::vector<std::string>& sources, const std::vector<CommitCopy>& copies, const std::vector<ZeroRange>& zeros,
                          std::vector<TensorRange> tensors, unsigned threads, bool onGpu, uint32_t prepared) {
  if (finals.size() != bytes.size() || writes.size() != bytes.size()) {
    throw DeviceError("E_BAD_PLAN", "pulled copies take one final descriptor (or -1), written flag and size per segment");
  }
  auto began = std::chrono::steady_clock::now();
  std::shared_ptr<const PreparedFinals> kept = preparedFinals(prepared, deviceIndex, finals.size());
  PrimaryContext context(deviceIndex);
  ScopedContext current(context.get());
  // Declared before the work, so that on a failure the work (its streams drained first) goes
  // before the finals the run made.
  auto held = std::make_shared<PullWork::Held>();
  auto work = std::make_unique<PullWork>(deviceIndex, writes, bytes, sources, copies, zeros, std::move(tensors), onGpu);
  CudaPulled out = work->run(finals, kept.get(), threads, *held);
  out.openMs = work->openMs();
  out.setupMs = work->setupMs();
  out.moduleMs = work->moduleMs();
  // What the call holds (the streams, drained already; the finals' mappings made here, the writer's
  // memory opened, the digest kernel's module and buffers) is let go of after the call answers, on
  // the releaser's thread (deferred_release.h), in this order, in this context. releaseMs times
  // the hand-over.
  out.releaseMs = releaseInContext(deviceIndex, [held, work = std::shared_ptr<PullWork>(std::move(work))]() mutable {
    work.reset();
    held.reset();
  });
  out.totalMs = msSince(began);
  return out;
}

double releaseInContext(int deviceIndex, std::function<void()> release) {
  auto t = std::chrono::steady_clock::now();
  releaseLater([deviceIndex, release = std::move(release)]() mutable {
    try {
      PrimaryContext context(deviceIndex);
      ScopedContext current(context.get());
      release();
      release = nullptr;  // what it captured goes here too, with the context current
    } catch (...) {
      // The releases' own failures are the driver's to report; nothing waits for them.
    }
  });
  return msSince(t);
}

}  // namespace weightd
