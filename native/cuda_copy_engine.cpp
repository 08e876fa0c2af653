#include "cuda_copy_engine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

#include "content_digests.h"
#include "cuda_digests.h"
#include "cuda_resources.h"
#include "file_reader.h"
#include "pinned_stash.h"
#include "fill_windows.h"
#include "reader_threads.h"

namespace weightd {

namespace {

// O_DIRECT needs offsets, lengths and buffer addresses on logical-block boundaries; 4096 covers
// both 512-byte and 4 KiB devices. Pinned buffers are page-aligned, so only offsets need care.
constexpr uint64_t kDirectAlign = 4096;
constexpr uint64_t kMinSlotBytes = 1ull << 20;
// Two slots overlap a lane's read with its copy. More only push buffers out of the CPU cache
// before the DMA reads them: on an H200 host 4 slots of 4 MiB ran at 28 GB/s, 2 at 36.
constexpr uint64_t kMaxSlotsPerLane = 2;

uint64_t alignDown(uint64_t v, uint64_t a) { return v / a * a; }

// A read-only mapping of part of a file.
class FileMapping {
 public:
  FileMapping(int fd, const std::string& path, uint64_t offset, uint64_t length) : length_(length) {
    void* p = mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
    if (p == MAP_FAILED) {
      int err = errno;
      throw DeviceError("E_FILE_READ", "cannot map " + std::to_string(length) + " bytes of " + path + " at byte " +
                                           std::to_string(offset) + ": " + errnoMessage(err));
    }
    base_ = static_cast<char*>(p);
    // Starts the reads of a cold window in one go; pinning would otherwise fault it in page by page.
    madvise(base_, length_, MADV_WILLNEED);
  }
  ~FileMapping() { munmap(base_, length_); }
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  char* data() const { return base_; }

 private:
  char* base_ = nullptr;
  uint64_t length_;
};

void unregisterHost(void* p) { cudaDriver().cuMemHostUnregister.raw(p); }

// A window of a file, mapped and pinned so the copy engine DMAs straight from the page cache.
// Each window is its own mapping: neighbouring windows may share a page, and one address range
// cannot be registered twice. Members unwind in reverse: unpin, then unmap.
class PinnedFileWindow {
 public:
  PinnedFileWindow(int fd, const std::string& path, uint64_t offset, uint64_t length)
      : mapping_(fd, path, offset, length) {
    // READ_ONLY: the mapping is PROT_READ, and the device only reads it. PORTABLE: every
    // member's context copies from it.
    cudaDriver().cuMemHostRegister_v2(mapping_.data(), length, CU_MEMHOSTREGISTER_READ_ONLY | CU_MEMHOSTREGISTER_PORTABLE);
    registration_ = Unique<void*, unregisterHost>(mapping_.data());
  }
  const char* data() const { return mapping_.data(); }

 private:
  FileMapping mapping_;
  Unique<void*, unregisterHost> registration_;
};

struct Slot {
  char* staging = nullptr;                   // pread mode: bufferBytes_ of the engine's staging block
  std::unique_ptr<PinnedFileWindow> window;  // register mode: what the queued copies read
  std::vector<Event> copied;                 // per member: recorded after its copies from this slot
  std::vector<uint64_t> pendingBytes;        // per member: queued, not yet counted in control.bytes
};

struct Lane {
  // Slots are declared before the streams so that they are destroyed after them: a stream's
  // destructor drains the copies that may still read the slots' buffers and windows.
  std::vector<Slot> slots;
  std::vector<Stream> streams;  // per member, created in that member's context
  // Per member whose GPU hashes digest pieces (cuda_digests.h): the digest kernels' stream, so
  // that this lane's next copies never wait behind a kernel.
  std::vector<Stream> hashStreams;
  std::vector<GpuDigests::Batch> batches;  // per member: its jobs not yet launched
  size_t next = 0;
};

// Lanes handed to reader threads one window at a time. There are as many lanes as threads, so
// a thread never waits here; the lock only keeps two threads off one lane's streams.
class LanePool {
 public:
  explicit LanePool(std::vector<std::unique_ptr<Lane>> lanes) : all_(std::move(lanes)) {
    for (auto& l : all_) free_.push_back(l.get());
  }
  Lane* acquire() {
    std::unique_lock<std::mutex> lock(mutex_);
    available_.wait(lock, [&] { return !free_.empty(); });
    Lane* l = free_.back();
    free_.pop_back();
    return l;
  }
  void release(Lane* l) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.push_back(l);
    }
    available_.notify_one();
  }
  std::vector<std::unique_ptr<Lane>>& all() { return all_; }

 private:
  std::vector<std::unique_ptr<Lane>> all_;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<Lane*> free_;
};

class LaneLease {
 public:
  explicit LaneLease(LanePool& pool) : pool_(pool), lane_(pool.acquire()) {}
  ~LaneLease() { pool_.release(lane_); }
  LaneLease(const LaneLease&) = delete;
  LaneLease& operator=(const LaneLease&) = delete;
  Lane& operator*() const { return *lane_; }

 private:
  LanePool& pool_;
  Lane* lane_;
};

// Reads a file from the block-aligned `start` through at least `neededEnd` into `dst`, through
// its O_DIRECT descriptor and in whole blocks (the file's last block may be short).
void readDirect(const FileSet& files, uint32_t file, int fd, char* dst, uint64_t start, uint64_t neededEnd) {
  uint64_t end = alignUp(neededEnd, kDirectAlign);
  uint64_t pos = start;
  while (pos < neededEnd) {
    ssize_t n = ::pread(fd, dst + (pos - start), end - pos, static_cast<off_t>(pos));
    if (n < 0 && errno == EINTR) continue;
    // EINVAL: the device wants a larger alignment than ours; EOF (n == 0): readFull reports it.
    // A short read that leaves an unaligned position can only finish through the page cache.
    if ((n < 0 && errno == EINVAL) || n == 0 || (n > 0 && (pos + n) % kDirectAlign != 0 && pos + n < neededEnd)) {
      if (n > 0) pos += static_cast<uint64_t>(n);
      files.readFull(file, dst + (pos - start), neededEnd - pos, pos);
      return;
    }
    if (n < 0) {
      int err = errno;
      throw DeviceError("E_FILE_READ", "read of " + files.path(file) + " at byte " + std::to_string(pos) +
                                           " failed: " + errnoMessage(err));
    }
    pos += static_cast<uint64_t>(n);
  }
}

// The members' file lists merged by path: each file is opened once however many members read it.
struct NodeFiles {
  std::vector<std::string> paths;
  std::vector<std::vector<uint32_t>> renumber;  // per member: its file index -> index in paths
};

NodeFiles mergeFiles(const std::vector<FillMember>& members) {
  NodeFiles out;
  std::map<std::string, uint32_t> index;
  for (const FillMember& m : members) {
    std::vector<uint32_t> renumber;
    for (const std::string& path : *m.files) {
      auto [it, added] = index.emplace(path, static_cast<uint32_t>(out.paths.size()));
      if (added) out.paths.push_back(path);
      renumber.push_back(it->second);
    }
    out.renumber.push_back(std::move(renumber));
  }
  return out;
}

// A member's ops with their file indexes moved into the merged list, checked against the files
// and the member's segments before any byte moves.
std::vector<CopyOp> nodeOps(size_t member, const FillMember& m, const std::vector<uint32_t>& renumber, const FileSet& files) {
  std::vector<CopyOp> ops = *m.ops;
  try {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].file >= renumber.size()) {
        throw DeviceError("E_BAD_PLAN", "copy op " + std::to_string(i) + " names file " + std::to_string(ops[i].file) + " of " +
                                            std::to_string(renumber.size()));
      }
      ops[i].file = renumber[ops[i].file];
    }
    validateOps(ops, files, m.target.segmentBytes);
  } catch (const DeviceError& e) {
    throw MemberFailure(member, m.target, e);
  }
  return ops;
}

// Checks every file once. When one cannot be opened, the error names the first member whose own
// list fails to open too: the GPU whose plan points at it.
FileSet openFiles(const std::vector<FillMember>& members, const NodeFiles& node, bool direct) {
  try {
    return FileSet(node.paths, direct);
  } catch (const DeviceError& e) {
    for (size_t m = 0; m < members.size(); ++m) {
      try {
        FileSet own(*members[m].files, direct);
      } catch (const DeviceError&) {
        throw MemberFailure(m, members[m].target, e);
      }
    }
    throw;
  }
}

// The members' tensor ranges, numbered into the merged file list, each once; `index[m][i]` is
// where member m's range i went.
struct NodeTensors {
  std::vector<TensorRange> ranges;
  std::vector<std::vector<size_t>> index;
};

NodeTensors mergeTensors(const std::vector<FillMember>& members, const NodeFiles& node) {
  NodeTensors out;
  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, size_t> seen;
  for (size_t m = 0; m < members.size(); ++m) {
    std::vector<size_t> index;
    if (members[m].tensors) {
      for (const TensorRange& t : *members[m].tensors) {
        if (t.file >= node.renumber[m].size()) {
          throw MemberFailure(m, members[m].target, DeviceError("E_BAD_PLAN", "tensor range names file " + std::to_string(t.file) + " of " +
                                                                                  std::to_string(node.renumber[m].size())));
        }
        TensorRange r{node.renumber[m][t.file], t.start, t.end};
        auto [it, added] = seen.emplace(std::make_tuple(r.file, r.start, r.end), out.ranges.size());
        if (added) out.ranges.push_back(r);
        index.push_back(it->second);
      }
    }
    out.index.push_back(std::move(index));
  }
  return out;
}

class CopyEngine {
 public:
  CopyEngine(const std::vector<FillMember>& members, const NodeFiles& node, NodeTensors tensors, const FillOptions& options)
      : members_(members),
        files_(openFiles(members, node, options.direct && options.mode == FillMode::Pread)),
        tensorIndex_(std::move(tensors.index)),
        digests_(std::move(tensors.ranges), files_),
        options_(options) {
    for (size_t m = 0; m < members_.size(); ++m) ops_.push_back(nodeOps(m, members_[m], node.renumber[m], files_));
    uint64_t staging = std::max(options.stagingBytes, kMinSlotBytes);
    slotBytes_ = std::clamp(options.chunkBytes, kMinSlotBytes, std::max(kMinSlotBytes, staging / 2));
    // A window holds slotBytes_ of the file in any mode. An O_DIRECT read starts at the block
    // boundary below its first byte and ends at the one above its last, and a window's first byte
    // is rarely on a boundary (a checkpoint's tensors start 8 + the header's length into their
    // file, and digest pieces at their tensor's start): a window of slotBytes_ spans at most one
    // block more, once slotBytes_ is whole blocks, and its buffer has that block to spare (4 KiB
    // of pinned memory per slot, outside the staging budget below). A window made a block short
    // instead ends inside a digest piece, so cut ends it at that piece's start: 8 MiB buffers
    // held 7 MiB windows, and 1 MiB ones held no whole piece, so every piece was read twice.
    if (options.mode == FillMode::Pread && options.direct) {
      slotBytes_ = alignUp(slotBytes_, kDirectAlign);
      bufferBytes_ = slotBytes_ + kDirectAlign;
    } else {
      bufferBytes_ = slotBytes_;
    }
    pageSize_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    std::vector<const std::vector<CopyOp>*> ops;
    for (auto& o : ops_) ops.push_back(&o);
    windows_ = planWindows(ops, slotBytes_, [this](uint32_t file, uint64_t from, uint64_t limit) { return digests_.cut(file, from, limit); });
    if (options.gpuDigests && !digests_.empty()) gpu_ = std::make_unique<GpuDigests>(members_, windows_, digests_);
    // threads and stagingBytes (src/native/fillPolicy.ts) are per GPU's worth of distinct bytes:
    // a group scales them by how many GPUs' worth it reads, which only the windows tell. Two
    // tensor-parallel ranks read two ranks' worth (16 threads by default): on 2 x H200, 8 threads
    // filled them at 38.7 GB/s, 16 at 53.3. Two replicas read one GPU's worth, and more threads
    // only take memory bandwidth from the copies to the second GPU (8 threads: 72.5 GB/s, 16:
    // 68.0). docs/gpu-results.md. The group's staging stays under maxGroupStagingBytes (and O_DIRECT's
    // spare block per slot).
    double scale = readShare();
    unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    uint64_t threads = std::clamp<uint64_t>(static_cast<uint64_t>(options.threads * scale + 0.5), 1, std::max(options.threads, cpus));
    uint64_t budget = std::min(static_cast<uint64_t>(staging * scale), std::max(staging, options.maxGroupStagingBytes));
    lanes_ = static_cast<unsigned>(std::clamp<uint64_t>(threads, 1, std::max<uint64_t>(1, budget / (2 * slotBytes_))));
    slotsPerLane_ = std::clamp<uint64_t>(budget / (lanes_ * slotBytes_), 1, kMaxSlotsPerLane);
  }

  void run() {
    const std::vector<FillWindow>& windows = windows_;
    // Host memory is pinned and registered with the first member's context current, and
    // PORTABLE, so that every member's context copies from it as pinned memory.
    ScopedContext base(members_[0].target.context);
    // The GPU digests' setup first (the kernel, loaded once per context, and the jobs uploaded):
    // 0.3 ms alone on an H100 (2026-12-07, bench/gpu/results/2026-12-07-h100-fill-setup-cut), where
    // on a thread of its own beside the lanes' setup it took 15-17 ms against their driver calls
    // (2026-12-06, bench/gpu/results/2026-12-06-h100-pull-digests).
    if (gpu_) gpu_->load();
    LanePool pool(makeLanes());
    std::atomic<bool> stop{false};  // this fill's own: set when any member is cancelled or fails
    try {
      runOnReaderThreads(windows.size(), lanes_, stop, [&](size_t i) {
        for (const FillMember& m : members_) {
          if (m.control->cancel.load(std::memory_order_relaxed)) throw DeviceError("E_FILL_CANCELLED", "fill cancelled before it finished");
        }
        ScopedContext onThisThread(members_[0].target.context);
        LaneLease lane(pool);
        send(*lane, i);
      });
      // The lanes' last batches, launched before the last copies are waited for, so that they
      // overlap them; then every kernel is waited for.
      if (gpu_) forEachHashStream(pool, [&](Lane& lane, size_t m) { gpu_->launch(lane.batches[m], m, lane.hashStreams[m].get()); });
      for (auto& lane : pool.all()) {
        for (auto& slot : lane->slots) retire(slot);
      }
      if (gpu_) {
        const auto copied = std::chrono::steady_clock::now();
        forEachHashStream(pool, [](Lane& lane, size_t m) { cudaDriver().cuStreamSynchronize(lane.hashStreams[m].get()); });
        gpu_->collect(digests_);
        digestTailSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - copied).count();
      }
    } catch (...) {
      destroyLanes(pool);
      throw;
    }
    destroyLanes(pool);
    uint64_t reread = digests_.hashRest(files_, lanes_, stop);
    std::vector<std::string> all = digests_.tensorDigests();
    for (size_t m = 0; m < members_.size(); ++m) {
      members_[m].control->digestRereadBytes = reread;
      members_[m].control->digestGpuBytes = gpu_ ? gpu_->bytes() : 0;
      members_[m].control->digestGpuUnavailable = gpu_ ? gpu_->unavailable() : "";
      members_[m].control->digestGpuSetupSeconds = gpu_ ? gpu_->setupSeconds() : 0;
      members_[m].control->digestGpuTailSeconds = digestTailSeconds_;
      members_[m].control->stagingSeconds = stagingSeconds_;
      members_[m].control->stagingPinnedAhead = stagingStashed_;
      std::vector<std::string>& own = members_[m].control->digests;
      own.clear();
      for (size_t i : tensorIndex_[m]) own.push_back(all[i]);
    }
  }

 private:
  std::vector<std::unique_ptr<Lane>> makeLanes() {
    // Every slot's staging in one pinned block (one 32 MiB block pinned in 12.5 ms where 16 of
    // 2 MiB took 14.8, H100): the one the CUDA warm-up pinned ahead where it is large enough
    // (pinned_stash.h), else pinned here.
    if (options_.mode == FillMode::Pread) {
      auto began = std::chrono::steady_clock::now();
      uint64_t needed = bufferBytes_ * lanes_ * slotsPerLane_;
      staging_ = takeStashedPinned(needed);
      stagingStashed_ = staging_.get() != nullptr;
      if (!staging_.get()) staging_ = allocatePinnedHost(needed);
      stagingSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    }
    std::vector<std::unique_ptr<Lane>> lanes;
    try {
      addLanes(lanes);
    } catch (...) {
      lanes.clear();
      staging_.reset();
      throw;
    }
    return lanes;
  }

  void addLanes(std::vector<std::unique_ptr<Lane>>& lanes) {
    char* next = static_cast<char*>(staging_.get());  // pread mode: each slot's bufferBytes_ in turn
    for (unsigned l = 0; l < lanes_; ++l) {
      auto lane = std::make_unique<Lane>();
      lane->slots.resize(slotsPerLane_);
      for (auto& slot : lane->slots) {
        slot.pendingBytes.assign(members_.size(), 0);
        if (options_.mode == FillMode::Pread) {
          slot.staging = next;
          next += bufferBytes_;
        }
      }
      for (size_t m = 0; m < members_.size(); ++m) {
        ScopedContext current(members_[m].target.context);
        lane->streams.push_back(createStream());
        lane->hashStreams.push_back(gpu_ && gpu_->anyJobs(m) ? createStream() : Stream());
        lane->batches.emplace_back();
        for (auto& slot : lane->slots) slot.copied.push_back(createEvent());
      }
      lanes.push_back(std::move(lane));
    }
  }

  // Bytes read over the bytes one GPU receives on average: from 1 (every GPU needs everything,
  // or there is one GPU) to the number of members (no byte is needed twice).
  double readShare() const {
    uint64_t read = 0, landed = 0;
    for (const FillWindow& w : windows_) {
      for (const ByteRange& r : windowReads(w, 1)) read += r.end - r.start;
      for (const WindowPiece& p : w.pieces) landed += p.payload();
    }
    if (landed == 0) return 1;
    double share = static_cast<double>(read) * members_.size() / static_cast<double>(landed);
    return std::clamp(share, 1.0, static_cast<double>(members_.size()));
  }

  // Streams and events are destroyed in their own member's context (the stream's destructor
  // drains its copies first), then the slots' host memory, in the first member's.
  void destroyLanes(LanePool& pool) {
    for (auto& lane : pool.all()) {
      for (size_t m = 0; m < members_.size() && m < lane->streams.size(); ++m) {
        ScopedContext current(members_[m].target.context);
        lane->streams[m].reset();
        if (m < lane->hashStreams.size()) lane->hashStreams[m].reset();
        for (auto& slot : lane->slots) {
          if (m < slot.copied.size()) slot.copied[m].reset();
        }
      }
      lane->slots.clear();
    }
    // Freed here, with the first member's context current (run()'s), not when the engine goes.
    staging_.reset();
  }

  // Calls work(lane, member) in the member's context for each lane's hash stream; a failure is
  // the fault of the member's GPU.
  template <typename Work>
  void forEachHashStream(LanePool& pool, Work work) {
    for (auto& lane : pool.all()) {
      for (size_t m = 0; m < members_.size(); ++m) {
        if (!lane->hashStreams[m].get()) continue;
        try {
          ScopedContext current(members_[m].target.context);
          work(*lane, m);
        } catch (const DeviceError& e) {
          throw MemberFailure(m, members_[m].target, e);
        }
      }
    }
  }

  // Waits for the copies that read this slot, counts their bytes as landed, and frees the slot.
  // An asynchronous fault of a copy surfaces here, and is the fault of the GPU it ran on.
  void retire(Slot& slot) {
    for (size_t m = 0; m < members_.size(); ++m) {
      if (!slot.pendingBytes[m]) continue;
      try {
        cudaDriver().cuEventSynchronize(slot.copied[m].get());
      } catch (const DeviceError& e) {
        throw MemberFailure(m, members_[m].target, e);
      }
      members_[m].control->bytes += slot.pendingBytes[m];
      slot.pendingBytes[m] = 0;
    }
    slot.window.reset();
  }

  void send(Lane& lane, size_t windowIndex) {
    const FillWindow& w = windows_[windowIndex];
    Slot& slot = lane.slots[lane.next++ % lane.slots.size()];
    retire(slot);
    std::vector<ByteRange> reads;
    const char* base = options_.mode == FillMode::Register ? pinWindow(slot, w, reads) : stage(slot, w, reads);
    const CudaDriver& drv = cudaDriver();
    // Pieces come ordered by member: one context switch and one event per member.
    for (size_t i = 0; i < w.pieces.size();) {
      const uint32_t m = w.pieces[i].member;
      const FillMember& member = members_[m];
      try {
        ScopedContext current(member.target.context);
        for (; i < w.pieces.size() && w.pieces[i].member == m; ++i) {
          const CopyOp& c = w.pieces[i].copy;
          const char* src = base + (c.srcOffset - w.start);
          CUdeviceptr dst = member.target.segmentBases[c.segment] + c.dstOffset;
          if (c.rows == 1) {
            drv.cuMemcpyHtoDAsync_v2(dst, src, c.rowBytes, lane.streams[m].get());
          } else {
            CUDA_MEMCPY2D copy{};
            copy.srcMemoryType = CU_MEMORYTYPE_HOST;
            copy.srcHost = src;
            copy.srcPitch = c.srcPitch;
            copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
            copy.dstDevice = dst;
            copy.dstPitch = c.rowBytes;
            copy.WidthInBytes = c.rowBytes;
            copy.Height = c.rows;
            drv.cuMemcpy2DAsync_v2(&copy, lane.streams[m].get());
          }
          slot.pendingBytes[m] += w.pieces[i].payload();
        }
        drv.cuEventRecord(slot.copied[m].get(), lane.streams[m].get());
        if (gpu_) gpu_->add(lane.batches[m], windowIndex, m, lane.hashStreams[m].get(), slot.copied[m].get());
      } catch (const DeviceError& e) {
        throw MemberFailure(m, member.target, e);
      }
    }
    // What the GPU does not hash, while the DMA reads the same buffer: the hash only reads it too,
    // and the slot is not reused before this thread comes back to it.
    for (const ByteRange& r : reads) digests_.hashCovered(w.file, r.start, r.end, base + static_cast<int64_t>(r.start - w.start));
  }

  // Reads what the window's copies need (windowReads) into the slot's staging buffer, each read
  // at its place in an image of the file; returns where byte w.start landed, and the reads in
  // `reads` (the bytes of the image that hold the file's).
  const char* stage(Slot& slot, const FillWindow& w, std::vector<ByteRange>& reads) {
    char* buf = slot.staging;
    std::shared_ptr<const OpenFile> file = files_.open(w.file);
    int fd = options_.direct ? file->directFd : -1;
    uint64_t align = fd < 0 ? 1 : kDirectAlign;
    uint64_t base = alignDown(w.start, align);
    reads = windowReads(w, align);
    for (const ByteRange& r : reads) {
      if (fd < 0) {
        files_.readFull(w.file, buf + (r.start - base), r.end - r.start, r.start);
      } else {
        readDirect(files_, w.file, fd, buf + (r.start - base), r.start, r.end);
      }
    }
    return buf + (w.start - base);
  }

  // Pins the window's whole span: a mapping is made and pinned per window, and cutting it into
  // a mapping per row would cost more than the pages skipped. Register mode is for a hot page
  // cache, where the skipped bytes are not read from disk anyway.
  const char* pinWindow(Slot& slot, const FillWindow& w, std::vector<ByteRange>& reads) {
    uint64_t start = alignDown(w.start, pageSize_);
    uint64_t end = alignUp(w.end, pageSize_);
    // The mapping outlives the descriptor: the set may close the file once this returns.
    slot.window = std::make_unique<PinnedFileWindow>(files_.open(w.file)->fd, files_.path(w.file), start, end - start);
    reads = {{w.start, w.end}};
    return slot.window->data() + (w.start - start);
  }

  const std::vector<FillMember>& members_;
  FileSet files_;
  std::vector<std::vector<size_t>> tensorIndex_;  // per member: its tensor ranges' places in digests_
  ContentDigests digests_;
  std::vector<std::vector<CopyOp>> ops_;  // per member, numbered into files_
  std::vector<FillWindow> windows_;
  std::unique_ptr<GpuDigests> gpu_;  // the pieces the GPUs hash; null when the CPU hashes all
  double digestTailSeconds_ = 0;     // FillControl::digestGpuTailSeconds
  FillOptions options_;
  uint64_t slotBytes_ = 0;    // the most file bytes a window spans
  uint64_t bufferBytes_ = 0;  // a pread slot's staging: slotBytes_, and with O_DIRECT one block more
  // The slots' staging (pread mode), declared before run()'s lanes are made and outliving them:
  // their streams drain before it goes. stagingStashed_: it was the warm-up's block.
  PinnedHostMemory staging_;
  bool stagingStashed_ = false;
  double stagingSeconds_ = 0;
  unsigned lanes_ = 1;
  uint64_t slotsPerLane_ = 1;
  uint64_t pageSize_ = 4096;
};

}  // namespace

void cudaFill(const std::vector<FillMember>& members, const FillOptions& options) {
  if (members.empty()) return;
  try {
    NodeFiles node = mergeFiles(members);
    NodeTensors tensors = mergeTensors(members, node);
    CopyEngine(members, node, std::move(tensors), options).run();
  } catch (const MemberFailure&) {
    throw;
  } catch (const DeviceError& e) {
    // Alone, every failure is this GPU's; in a group, one nobody caused (a shared file that
    // cannot be read, a cancel) reaches every member as it is.
    if (members.size() == 1) throw MemberFailure(0, members[0].target, e);
    throw;
  }
}

}  // namespace weightd
