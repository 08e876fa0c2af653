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

CudaDevice::CudaDevice(int index, const std::string& expectedUuid, CudaHandles handles, bool deferContext)
    : index_(index), handles_(handles), deferContext_(deferContext), identity_(describeCudaDevice(index)) {
  if (!expectedUuid.empty() && expectedUuid != identity_.uuid) {
    throw DeviceError("E_DEVICE_MISMATCH", "CUDA device " + std::to_string(index) + " is " + identity_.uuid + " (" +
                                               identity_.name + "), not the expected " + expectedUuid +
                                               "; check that CUDA_VISIBLE_DEVICES is the same for every process of this node");
  }
  if (handles == CudaHandles::Fd) {
    std::string why = fdHandlesUnsupported(cudaDeviceAt(index));
    if (!why.empty()) {
      throw DeviceError("E_CUDA_HANDLES_UNSUPPORTED", label() + " (" + identity_.name + ") cannot serve --cuda-handles fd: " + why +
                                                          "; use --cuda-handles ipc (the default)");
    }
  }
  // Retained now, unless deferred: a context that cannot be made fails the rank's open, before
  // it adopts or allocates anything.
  if (deferContext) return;
  std::lock_guard<std::mutex> lock(mutex_);
  onDevice([&] { return contextLocked(); });
}

CudaDevice::HeldFd::~HeldFd() {
  if (fd_ >= 0) ::close(fd_);
}

CudaDevice::HeldFd& CudaDevice::HeldFd::operator=(HeldFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
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
  // Free memory is a context's question: a device that has made none yet (deferred) does not make
  // one to answer.
  if (deferContext_ && !context_) {
    DeviceInfo d = identity_;
    d.freeProbed = false;
    return d;
  }
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
    ScopedContext current(contextLocked());
    const bool vmm = handles_ == CudaHandles::Fd;
    CUdevice dev = vmm ? cudaDeviceAt(index_) : 0;
    // Rounded up to whole 2 MiB pages: the driver maps an allocation of any other size with
    // small pages, and a client's cuIpcOpenMemHandle of it then takes ~45 ms for 8.5 GB on an
    // H200 instead of 0.25 ms (bench/gpu/ipc-open-probe.py). The tail is never read. VMM memory
    // is also rounded to the driver's granularity (cuda_vmm.h).
    std::vector<uint64_t> sizes;
    uint64_t total = 0;
    for (size_t i = 0; i < segmentBytes.size(); ++i) {
      if (segmentBytes[i] == 0) throw DeviceError("E_BAD_PLAN", "segment " + std::to_string(i) + " has zero bytes");
      sizes.push_back(vmm ? vmmSegmentSize(dev, segmentBytes[i]) : alignUp(segmentBytes[i], kLargePage));
      total += sizes.back();
    }
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
      // A failure midway frees what was made: the segments made so far here, the failing one's
      // own steps in VmmSegment::create.
      for (size_t i = 0; i < sizes.size(); ++i) {
        Segment s;
        s.bytes = segmentBytes[i];
        if (vmm) s.vmm = VmmSegment::create(dev, sizes[i]);
        else s.memory = allocateDeviceMemory(sizes[i]);
        segments_.push_back(std::move(s));
      }
    } catch (...) {
      segments_.clear();
      throw;
    }
  });
}

void CudaDevice::fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
                      const std::vector<ZeroRange>& zeros, const std::vector<TensorRange>& tensors, const FillOptions& options,
                      FillControl& control) {
  FillMember self;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (segments_.empty()) throw DeviceError("E_NOT_ALLOCATED", "fill before allocate on device " + identity_.uuid);
    if (adopted_) {
      throw DeviceError("E_ADOPTED", label() + " holds an adopted arena, filled by the process that exported it; free it and allocate to load afresh");
    }
    self.target.context = contextLocked();
    self.target.label = label();
    for (auto& s : segments_) {
      self.target.segmentBases.push_back(s.base());
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
  self.tensors = &tensors;
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
  std::vector<SegmentExport> out;
  // Adopted descriptors are exported as they came, with no driver call: a device whose context is
  // deferred exports them before (or without) making one.
  if (adopted_) {
    for (uint32_t i = 0; i < segments_.size(); ++i) out.push_back({i, segments_[i].bytes, "cuda-fd", segments_[i].adopted.get()});
    return out;
  }
  return onDevice([&] {
    ScopedContext current(contextLocked());
    for (uint32_t i = 0; i < segments_.size(); ++i) {
      Segment& s = segments_[i];
      if (s.vmm.pointer()) {
        out.push_back({i, s.bytes, "cuda-fd", s.vmm.exportFd()});
        continue;
      }
      CUipcMemHandle handle{};
      cudaDriver().cuIpcGetMemHandle(&handle, s.memory.get());
      out.push_back({i, s.bytes, base64Encode(handle.reserved, sizeof handle.reserved)});
    }
    return out;
  });
}

void CudaDevice::adopt(const std::vector<int>& fds, const std::vector<uint64_t>& segmentBytes) {
  // Every descriptor is ours from the call on: those not yet held by a segment are closed here
  // when adopt fails, and the segments' own with them.
  size_t held = 0;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!segments_.empty()) {
      throw DeviceError("E_ALREADY_ALLOCATED", "device " + identity_.uuid + " already holds an arena; free it before adopting another");
    }
    if (fds.empty() || fds.size() != segmentBytes.size()) {
      throw DeviceError("E_BAD_ADOPT", "adopt got " + std::to_string(fds.size()) + " descriptor(s) for " + std::to_string(segmentBytes.size()) +
                                           " segment size(s); pass one descriptor per segment, in segment order");
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] < 0 || segmentBytes[i] == 0) {
        throw DeviceError("E_BAD_ADOPT", "segment " + std::to_string(i) + " has descriptor " + std::to_string(fds[i]) + " and " +
                                             std::to_string(segmentBytes[i]) + " bytes; each needs an open descriptor and at least one byte");
      }
    }
    for (; held < fds.size(); ++held) {
      Segment s;
      s.bytes = segmentBytes[held];
      s.adopted = HeldFd(fds[held]);
      segments_.push_back(std::move(s));
    }
    adopted_ = true;
    if (!context_) return;  // deferred: checkAdopted() maps them
    try {
      mapAdoptedLocked();
    } catch (...) {
      // Closes every descriptor (held == fds.size() here); the context stays for a load.
      ScopedContext current(context_->get());
      segments_.clear();
      adopted_ = false;
      throw;
    }
  } catch (...) {
    for (size_t i = held; i < fds.size(); ++i) ::close(fds[i]);
    throw;
  }
}

void CudaDevice::checkAdopted() {
  std::lock_guard<std::mutex> lock(mutex_);
  mapAdoptedLocked();
}

void CudaDevice::mapAdoptedLocked() {
  onDevice([&] {
    ScopedContext current(contextLocked());
    CUdevice dev = cudaDeviceAt(index_);
    for (size_t i = 0; i < segments_.size(); ++i) {
      Segment& s = segments_[i];
      if (s.adopted.get() < 0 || s.vmm.pointer()) continue;
      try {
        // Mapped read-only, as a client maps it: the daemon only reads adopted memory (fill()
        // refuses it). The import takes its own reference; the descriptor stays the segment's.
        s.vmm = VmmSegment::import(dev, s.adopted.get(), vmmSegmentSize(dev, s.bytes));
      } catch (const DeviceError& e) {
        throw DeviceError(e.code(), "adopting segment " + std::to_string(i) + " (descriptor " + std::to_string(s.adopted.get()) + ", " +
                                        std::to_string(s.bytes) + " bytes): " + e.what() +
                                        "; is the descriptor one a cuda device exported with --cuda-handles fd, for this GPU and this segment?");
      }
    }
  });
}

void CudaDevice::read(uint32_t segment, uint64_t offset, uint64_t length, void* dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  checkReadRange(segments_, segment, offset, length);
  if (length == 0) return;
  // A read of adopted memory not checked yet checks it first (the check maps it).
  if (adopted_) mapAdoptedLocked();
  onDevice([&] {
    ScopedContext current(contextLocked());
    cudaDriver().cuMemcpyDtoH_v2(dst, segments_[segment].base() + offset, length);
  });
}

void CudaDevice::free() {
  std::lock_guard<std::mutex> lock(mutex_);
  freeLocked();
}

void CudaDevice::freeLocked() {
  if (!context_) {
    // Deferred and never made: only held descriptors to close (no mapping needs the driver).
    segments_.clear();
    adopted_ = false;
    return;
  }
  try {
    ScopedContext current(context_->get());
    segments_.clear();
  } catch (const DeviceError&) {
    // The context could not be made current (the driver is failing): free without it, as a
    // best effort, since free() also runs from destructors and must not throw.
    segments_.clear();
  }
  adopted_ = false;
  context_.reset();
}

}  // namespace weightd
