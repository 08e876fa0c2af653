#include "cuda_vmm.h"

#include <unistd.h>

#include <utility>

namespace weightd {

namespace {

constexpr uint64_t kLargePage = 2ull << 20;

// Pinned device memory on `dev` that may be exported as a POSIX file descriptor.
CUmemAllocationProp fdExportableProp(CUdevice dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

uint64_t granularity(CUdevice dev) {
  CUmemAllocationProp prop = fdExportableProp(dev);
  size_t g = 0;
  cudaDriver().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (g == 0) throw DeviceError("E_CUDA", "cuMemGetAllocationGranularity reported a granularity of 0 bytes");
  return g;
}

}  // namespace

CudaHandles parseCudaHandles(const std::string& name) {
  if (name == "ipc") return CudaHandles::Ipc;
  if (name == "fd") return CudaHandles::Fd;
  throw DeviceError("E_BAD_OPTION", "cudaHandles '" + name + "' is not a kind of CUDA handle; use 'ipc' or 'fd'");
}

std::string fdHandlesUnsupported(CUdevice dev) {
  const CudaDriver& drv = cudaDriver();
  int vmm = 0, fd = 0;
  drv.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  if (!vmm) return "the GPU or its driver does not support CUDA virtual memory management (cuMemCreate)";
  drv.cuDeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
  if (!fd) return "the GPU or its driver cannot export memory as a POSIX file descriptor";
  return "";
}

uint64_t vmmSegmentSize(CUdevice dev, uint64_t bytes) {
  uint64_t g = granularity(dev);
  // Both are powers of two on every driver; the larger is then a multiple of the smaller.
  return alignUp(alignUp(bytes, kLargePage), g);
}

VmmSegment::VmmSegment(VmmSegment&& other) noexcept
    : handle_(std::exchange(other.handle_, 0)),
      haveHandle_(std::exchange(other.haveHandle_, false)),
      pointer_(std::exchange(other.pointer_, 0)),
      mapped_(std::exchange(other.mapped_, false)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

VmmSegment& VmmSegment::operator=(VmmSegment&& other) noexcept {
  if (this != &other) {
    reset();
    handle_ = std::exchange(other.handle_, 0);
    haveHandle_ = std::exchange(other.haveHandle_, false);
    pointer_ = std::exchange(other.pointer_, 0);
    mapped_ = std::exchange(other.mapped_, false);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

VmmSegment VmmSegment::create(CUdevice dev, uint64_t size) {
  VmmSegment s;  // whatever the steps below made is undone by its destructor if one fails
  s.size_ = size;
  CUmemAllocationProp prop = fdExportableProp(dev);
  cudaDriver().cuMemCreate(&s.handle_, size, &prop, 0);
  s.haveHandle_ = true;
  s.mapOn(dev);
  return s;
}

VmmSegment VmmSegment::import(CUdevice dev, int fd, uint64_t size) {
  VmmSegment s;
  s.size_ = size;
  s.importFrom(fd);
  // A client only reads the daemon's memory, and every other client maps it too: read-only, so
  // no kernel of this process can write into it (a write faults here instead of corrupting them).
  s.mapOn(dev, CU_MEM_ACCESS_FLAGS_PROT_READ);
  return s;
}

VmmSegment VmmSegment::importWritable(CUdevice dev, int fd, uint64_t size) {
  VmmSegment s;
  s.size_ = size;
  s.importFrom(fd);
  s.mapOn(dev);
  return s;
}

void VmmSegment::importFrom(int fd) {
  // The descriptor is passed by value, cast to the pointer-sized parameter (the driver's convention).
  cudaDriver().cuMemImportFromShareableHandle(&handle_, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  haveHandle_ = true;
}

void VmmSegment::mapOn(CUdevice dev, CUmemAccess_flags flags) {
  const CudaDriver& drv = cudaDriver();
  drv.cuMemAddressReserve(&pointer_, size_, granularity(dev), 0, 0);
  // An allocation smaller than size_ (a descriptor of another segment) fails here.
  drv.cuMemMap(pointer_, size_, 0, handle_, 0);
  mapped_ = true;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = flags;
  // A driver that refuses read-only device mappings gets read-write, as the Python client does:
  // the client still writes nothing, but nothing stops a kernel of its process from doing so.
  if (flags == CU_MEM_ACCESS_FLAGS_PROT_READ && drv.cuMemSetAccess.raw(pointer_, size_, &access, 1) == CUDA_SUCCESS) return;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  drv.cuMemSetAccess(pointer_, size_, &access, 1);
}

int VmmSegment::exportFd() {
  if (fd_ < 0) {
    int fd = -1;
    cudaDriver().cuMemExportToShareableHandle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    fd_ = fd;
  }
  return fd_;
}

// The memory itself goes when its last reference does: this handle, this mapping, a descriptor
// (here or in any process holding one) and any other process's import of it.
void VmmSegment::reset() {
  if (!haveHandle_ && !pointer_ && fd_ < 0) return;  // empty (moved from): no driver needed
  const CudaDriver& drv = cudaDriver();
  if (mapped_) drv.cuMemUnmap.raw(pointer_, size_);
  if (pointer_) drv.cuMemAddressFree.raw(pointer_, size_);
  if (haveHandle_) drv.cuMemRelease.raw(handle_);
  if (fd_ >= 0) ::close(fd_);
  handle_ = 0;
  haveHandle_ = mapped_ = false;
  pointer_ = 0;
  size_ = 0;
  fd_ = -1;
}

}  // namespace weightd
