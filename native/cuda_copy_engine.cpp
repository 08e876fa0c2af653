#include "cuda_copy_engine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "cuda_resources.h"
#include "file_reader.h"

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

// One copy from one contiguous span of a file: `rows` rows of `rowBytes`, `srcPitch` apart from
// `srcOffset`, written densely at `dst`.
struct Transfer {
  uint32_t file;
  uint64_t srcOffset;
  uint64_t rows;
  uint64_t rowBytes;
  uint64_t srcPitch;
  CUdeviceptr dst;
  uint64_t span() const { return (rows - 1) * srcPitch + rowBytes; }
  uint64_t payload() const { return rows * rowBytes; }
};

// Cuts a chunk into transfers whose source span fits in `capacity`. splitIntoChunks keeps each
// chunk's span within the chunk size except for a single row longer than it, which goes in
// contiguous pieces.
template <typename F>
void forEachTransfer(const CopyOp& op, const Chunk& c, CUdeviceptr segmentBase, uint64_t capacity, F&& f) {
  CUdeviceptr dst = segmentBase + op.dstOffset;
  if (op.rows <= 1) {
    f(Transfer{op.file, op.srcOffset + c.byteStart, 1, c.byteCount, c.byteCount, dst + c.byteStart});
    return;
  }
  Transfer t{op.file, op.srcOffset + c.firstRow * op.srcPitch, c.rowCount, op.rowBytes, op.srcPitch,
             dst + c.firstRow * op.rowBytes};
  if (t.span() <= capacity) {
    f(t);
    return;
  }
  for (uint64_t r = c.firstRow; r < c.firstRow + c.rowCount; ++r) {
    for (uint64_t b = 0; b < op.rowBytes; b += capacity) {
      uint64_t n = std::min(capacity, op.rowBytes - b);
      f(Transfer{op.file, op.srcOffset + r * op.srcPitch + b, 1, n, n, dst + r * op.rowBytes + b});
    }
  }
}

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
    // READ_ONLY: the mapping is PROT_READ, and the device only reads it.
    cudaDriver().cuMemHostRegister_v2(mapping_.data(), length, CU_MEMHOSTREGISTER_READ_ONLY);
    registration_ = Unique<void*, unregisterHost>(mapping_.data());
  }
  const char* data() const { return mapping_.data(); }

 private:
  FileMapping mapping_;
  Unique<void*, unregisterHost> registration_;
};

struct Slot {
  Event copied;
  PinnedHostMemory staging;                  // pread mode
  std::unique_ptr<PinnedFileWindow> window;  // register mode: what the queued copy reads
  uint64_t pendingBytes = 0;                 // queued on the device, not yet counted in progress
};

struct Lane {
  // Declared before the stream so that they are destroyed after it: the stream's destructor
  // drains the copies that may still read their buffers and windows.
  std::vector<Slot> slots;
  Stream stream;
  size_t next = 0;
};

// Lanes handed to reader threads one chunk at a time. There are as many lanes as threads, so a
// thread never waits here; the lock only keeps two threads off one stream.
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
  const std::vector<std::unique_ptr<Lane>>& all() const { return all_; }

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

// Waits for the copy that reads this slot, counts its bytes as landed, and frees the slot.
void retire(Slot& slot, FillProgress& progress) {
  if (slot.pendingBytes) {
    cudaDriver().cuEventSynchronize(slot.copied.get());
    progress.bytes += slot.pendingBytes;
    slot.pendingBytes = 0;
  }
  slot.window.reset();
}

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

class CopyEngine {
 public:
  CopyEngine(const CudaFillTarget& target, const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
             const FillOptions& options)
      : target_(target), files_(files, options.direct && options.mode == FillMode::Pread), ops_(ops), options_(options) {
    validateOps(ops_, files_, target_.segmentBytes);
    uint64_t staging = std::max(options.stagingBytes, kMinSlotBytes);
    slotBytes_ = std::clamp(options.chunkBytes, kMinSlotBytes, std::max(kMinSlotBytes, staging / 2));
    lanes_ = static_cast<unsigned>(std::clamp<uint64_t>(options.threads, 1, std::max<uint64_t>(1, staging / (2 * slotBytes_))));
    slotsPerLane_ = std::clamp<uint64_t>(staging / (lanes_ * slotBytes_), 1, kMaxSlotsPerLane);
    // An O_DIRECT read covers whole blocks around its span: leave room for one at each end.
    capacity_ = slotBytes_ - (options.mode == FillMode::Pread && options.direct ? 2 * kDirectAlign : 0);
    pageSize_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  }

  void run(FillProgress& progress) {
    std::vector<Chunk> chunks = splitIntoChunks(ops_, capacity_);
    ScopedContext current(target_.context);
    LanePool pool(makeLanes());
    runChunks(chunks.size(), lanes_, progress, [&](size_t i) {
      ScopedContext onThisThread(target_.context);
      LaneLease lane(pool);
      const Chunk& c = chunks[i];
      const CopyOp& op = ops_[c.op];
      forEachTransfer(op, c, target_.segmentBases[op.segment], capacity_,
                      [&](const Transfer& t) { send(*lane, t, progress); });
    });
    for (auto& lane : pool.all()) {
      for (auto& slot : lane->slots) retire(slot, progress);
    }
  }

 private:
  std::vector<std::unique_ptr<Lane>> makeLanes() {
    std::vector<std::unique_ptr<Lane>> lanes;
    for (unsigned l = 0; l < lanes_; ++l) {
      auto lane = std::make_unique<Lane>();
      lane->stream = createStream();
      lane->slots.resize(slotsPerLane_);
      for (auto& slot : lane->slots) {
        slot.copied = createEvent();
        if (options_.mode == FillMode::Pread) slot.staging = allocatePinnedHost(slotBytes_);
      }
      lanes.push_back(std::move(lane));
    }
    return lanes;
  }

  void send(Lane& lane, const Transfer& t, FillProgress& progress) {
    Slot& slot = lane.slots[lane.next++ % lane.slots.size()];
    retire(slot, progress);
    const char* src = options_.mode == FillMode::Register ? pinWindow(slot, t) : stage(slot, t);
    const CudaDriver& drv = cudaDriver();
    if (t.rows == 1) {
      drv.cuMemcpyHtoDAsync_v2(t.dst, src, t.rowBytes, lane.stream.get());
    } else {
      CUDA_MEMCPY2D copy{};
      copy.srcMemoryType = CU_MEMORYTYPE_HOST;
      copy.srcHost = src;
      copy.srcPitch = t.srcPitch;
      copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
      copy.dstDevice = t.dst;
      copy.dstPitch = t.rowBytes;
      copy.WidthInBytes = t.rowBytes;
      copy.Height = t.rows;
      drv.cuMemcpy2DAsync_v2(&copy, lane.stream.get());
    }
    drv.cuEventRecord(slot.copied.get(), lane.stream.get());
    slot.pendingBytes = t.payload();
  }

  const char* stage(Slot& slot, const Transfer& t) {
    char* buf = static_cast<char*>(slot.staging.get());
    int fd = options_.direct ? files_.directFd(t.file) : -1;
    if (fd < 0) {
      files_.readFull(t.file, buf, t.span(), t.srcOffset);
      return buf;
    }
    uint64_t start = alignDown(t.srcOffset, kDirectAlign);
    readDirect(files_, t.file, fd, buf, start, t.srcOffset + t.span());
    return buf + (t.srcOffset - start);
  }

  const char* pinWindow(Slot& slot, const Transfer& t) {
    uint64_t start = alignDown(t.srcOffset, pageSize_);
    uint64_t end = alignUp(t.srcOffset + t.span(), pageSize_);
    slot.window = std::make_unique<PinnedFileWindow>(files_.fd(t.file), files_.path(t.file), start, end - start);
    return slot.window->data() + (t.srcOffset - start);
  }

  const CudaFillTarget& target_;
  FileSet files_;
  const std::vector<CopyOp>& ops_;
  FillOptions options_;
  uint64_t slotBytes_ = 0;
  unsigned lanes_ = 1;
  uint64_t slotsPerLane_ = 1;
  uint64_t capacity_ = 0;
  uint64_t pageSize_ = 4096;
};

}  // namespace

void cudaFill(const CudaFillTarget& target, const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
              const FillOptions& options, FillProgress& progress) {
  CopyEngine(target, files, ops, options).run(progress);
}

}  // namespace weightd
