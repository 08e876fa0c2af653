#include "cuda_device.h"

#include <unistd.h>

#include <cstdio>

#include "cuda_copy_engine.h"
#include "cuda_driver.h"
#include "cuda_fill_group.h"
#include "cuda_ipc.h"

namespace weightd {

namespace {

// The GPU's large page: allocations are made of whole ones (see allocate).
constexpr uint64_t kLargePage = 2ull << 20;

std::string gib(uint64_t bytes) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

// cuMemAlloc leaves memory as it was: writes zeros over exactly the ranges, on a stream of the
// target's context, and waits for them, so the cost is the padding's bytes and nothing else.
// Padding never overlaps an op's destination (the planner's rule), so the copies need not wait.
void zeroRanges(const CudaFillTarget& target, const std::vector<ZeroRange>& zeros) {
  if (zeros.empty()) return;
  const CudaDriver& drv = cudaDriver();
  ScopedContext current(target.context);
  Stream stream = createStream();  // destroyed (drained) before the context is popped
  for (size_t i = 0; i < zeros.size(); ++i) {
    const ZeroRange& z = zeros[i];
    CUdeviceptr dst = target.segmentBases[z.segment] + z.offset;
    try {
      // Segment bases are 2 MiB aligned: a range on 4-byte boundaries takes the wider memset.
      if (z.offset % 4 == 0 && z.bytes % 4 == 0) drv.cuMemsetD32Async(dst, 0, z.bytes / 4, stream.get());
      else drv.cuMemsetD8Async(dst, 0, z.bytes, stream.get());
    } catch (const DeviceError& e) {
      throw DeviceError(e.code(), "zeroing padding range " + std::to_string(i) + " (" + std::to_string(z.bytes) + " bytes at " +
                                      std::to_string(z.offset) + " of segment " + std::to_string(z.segment) + "): " + e.what());
    }
  }
  drv.cuStreamSynchronize(stream.get());
}

}  // namespace

CudaDevice::CudaDevice(int index, const std::string& expectedUuid) : index_(index), identity_(describeCudaDevice(index)) {
  if (!expectedUuid.empty() && expectedUuid != identity_.uuid) {
    throw DeviceError("E_DEVICE_MISMATCH", "CUDA device " + std::to_string(index) + " is " + identity_.uuid + " (" +
                                               identity_.name + "), not the expected " + expectedUuid +
                                               "; check that CUDA_VISIBLE_DEVICES is the same for every process of this node");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  onDevice([&] { return contextLocked(); });
}

CudaDevice::~CudaDevice() { free(); }

template <typename Fn>
auto CudaDevice::onDevice(Fn fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const DeviceError& e) {
    throw DeviceError(e.code(), label() + ": " + e.what());
  }
}

std::string CudaDevice::label() const { return "GPU " + std::to_string(index_) + " (" + identity_.uuid + ")"; }

CUcontext CudaDevice::contextLocked() {
  if (!context_) context_ = std::make_unique<PrimaryContext>(index_);
  return context_->get();
}

DeviceInfo CudaDevice::info() {
  std::lock_guard<std::mutex> lock(mutex_);
  return onDevice([&] {
    ScopedContext current(contextLocked());
    size_t freeBytes = 0, totalBytes = 0;
    cudaDriver().cuMemGetInfo_v2(&freeBytes, &totalBytes);
    DeviceInfo d = identity_;
    d.freeBytes = freeBytes;
    return d;
  });
}

void CudaDevice::allocate(const std::vector<uint64_t>& segmentBytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!segments_.empty()) {
    throw DeviceError("E_ALREADY_ALLOCATED", "device " + identity_.uuid + " already holds an arena; free it first");
  }
  onDevice([&] {
    uint64_t total = 0;
    for (size_t i = 0; i < segmentBytes.size(); ++i) {
      if (segmentBytes[i] == 0) throw DeviceError("E_BAD_PLAN", "segment " + std::to_string(i) + " has zero bytes");
      total += alignUp(segmentBytes[i], kLargePage);
    }
    ScopedContext current(contextLocked());
    size_t freeBytes = 0, totalBytes = 0;
    cudaDriver().cuMemGetInfo_v2(&freeBytes, &totalBytes);
    // Checked up front so a short GPU fails in milliseconds with numbers, not after a partial
    // allocation (cuMemAlloc may still fail later through fragmentation; that error says so too).
    if (total > freeBytes) {
      throw DeviceError("E_OUT_OF_MEMORY", "the arena needs " + gib(total) + " in " + std::to_string(segmentBytes.size()) +
                                               " segment(s) but " + identity_.name + " has " + gib(freeBytes) + " free of " +
                                               gib(totalBytes) +
                                               "; stop what else uses this GPU (nvidia-smi lists it) or spread the model over "
                                               "more GPUs (a larger tensor-parallel size)");
    }
    try {
      // Rounded up to whole 2 MiB pages: the driver maps an allocation of any other size with
      // small pages, and a client's cuIpcOpenMemHandle of it then takes ~45 ms for 8.5 GB on an
      // H200 instead of 0.25 ms (bench/gpu/ipc-open-probe.py). The tail is never read.
      for (uint64_t bytes : segmentBytes) segments_.push_back(Segment{allocateDeviceMemory(alignUp(bytes, kLargePage)), bytes});
    } catch (...) {
      segments_.clear();
      throw;
    }
  });
}

void CudaDevice::fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
                      const std::vector<ZeroRange>& zeros, const FillOptions& options, FillControl& control) {
  FillMember self;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (segments_.empty()) throw DeviceError("E_NOT_ALLOCATED", "fill before allocate on device " + identity_.uuid);
    self.target.context = contextLocked();
    self.target.label = label();
    for (auto& s : segments_) {
      self.target.segmentBases.push_back(s.memory.get());
      self.target.segmentBytes.push_back(s.bytes);
    }
  }
  // Before the copies (and before joining a group), so a failure here is this GPU's alone.
  onDevice([&] {
    validateZeroRanges(zeros, self.target.segmentBytes);
    zeroRanges(self.target, zeros);
  });
  self.files = &files;
  self.ops = &ops;
  self.control = &control;
  // The lock is not held while copying: the bindings refuse every other call on a filling
  // device, and info() must not wait minutes behind a fill. The engine names the GPU in the
  // errors that concern one (a group's fill may fail on another member's GPU).
  if (options.groupSize > 1) {
    fillInGroup(options.groupId, options.groupSize, self, options);
  } else {
    cudaFill({self}, options);
  }
}

std::vector<SegmentExport> CudaDevice::exportSegments() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (segments_.empty()) throw DeviceError("E_NOT_ALLOCATED", "export before allocate on device " + identity_.uuid);
  return onDevice([&] {
    ScopedContext current(contextLocked());
    std::vector<SegmentExport> out;
    for (uint32_t i = 0; i < segments_.size(); ++i) {
      CUipcMemHandle handle{};
      cudaDriver().cuIpcGetMemHandle(&handle, segments_[i].memory.get());
      out.push_back({i, segments_[i].bytes, base64Encode(handle.reserved, sizeof handle.reserved)});
    }
    return out;
  });
}

void CudaDevice::adopt(const std::vector<int>& fds, const std::vector<uint64_t>&) {
  for (int fd : fds) ::close(fd);  // adopt owns them, failed or not
  throw DeviceError("E_UNSUPPORTED", "adopt needs --cuda-handles fd: " + label() + " holds legacy IPC memory, which no descriptor can carry");
}

void CudaDevice::read(uint32_t segment, uint64_t offset, uint64_t length, void* dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  checkReadRange(segments_, segment, offset, length);
  if (length == 0) return;
  onDevice([&] {
    ScopedContext current(contextLocked());
    cudaDriver().cuMemcpyDtoH_v2(dst, segments_[segment].memory.get() + offset, length);
  });
}

void CudaDevice::free() {
  std::lock_guard<std::mutex> lock(mutex_);
  freeLocked();
}

void CudaDevice::freeLocked() {
  if (!context_) return;
  try {
    ScopedContext current(context_->get());
    segments_.clear();
  } catch (const DeviceError&) {
    // The context could not be made current (the driver is failing): free without it, as a
    // best effort, since free() also runs from destructors and must not throw.
    segments_.clear();
  }
  context_.reset();
}

}  // namespace weightd
