// CUDA virtual memory management (VMM) for one segment: physical memory made with cuMemCreate so
// that it can be exported as a POSIX file descriptor, mapped at an address range of its own. A
// descriptor outlives the process that made it (another process holding it keeps the memory), which
// legacy IPC handles cannot do: this is what --cuda-handles fd and adoption build on.
#pragma once
#include <cstdint>
#include <string>

#include "cuda_driver.h"

namespace weightd {

// How a cuda device allocates and exports its segments (the daemon's --cuda-handles).
enum class CudaHandles {
  Ipc,  // cuMemAlloc + legacy CUDA IPC handles (cuIpcGetMemHandle), the default
  Fd,   // cuMemCreate + POSIX file descriptors (cuMemExportToShareableHandle)
};

// "ipc" or "fd"; E_BAD_OPTION names the value otherwise.
CudaHandles parseCudaHandles(const std::string& name);

// Why device `dev` cannot hold fd-exportable VMM memory ("" when it can): a device attribute, so
// the answer needs no context.
std::string fdHandlesUnsupported(CUdevice dev);

// The size a segment of `bytes` is given: whole 2 MiB pages (the driver maps anything else with
// small pages, and opening it in a client then takes 180 times as long; cuda_device.cpp) and
// whole granules of the device's VMM granularity (cuMemCreate refuses less), which on every GPU
// weightd has met is 2 MiB too.
uint64_t vmmSegmentSize(CUdevice dev, uint64_t bytes);

// One VMM segment: the allocation handle, the reserved address range, its mapping, access for
// its device and, once exported, its descriptor. Move-only; destroying it
// undoes in reverse order whatever was done (also after a failure midway), with the context that
// made it current: the caller's ScopedContext.
class VmmSegment {
 public:
  VmmSegment() = default;
  ~VmmSegment() { reset(); }
  VmmSegment(VmmSegment&& other) noexcept;
  VmmSegment& operator=(VmmSegment&& other) noexcept;
  VmmSegment(const VmmSegment&) = delete;
  VmmSegment& operator=(const VmmSegment&) = delete;

  // New memory of `size` bytes (a vmmSegmentSize) on device `dev`, exportable as a descriptor.
  static VmmSegment create(CUdevice dev, uint64_t size);
  // The memory behind `fd` (a descriptor another VmmSegment exported, perhaps in another process),
  // mapped for `size` bytes on device `dev`, read-only where the driver allows: for a client, and
  // for a daemon's adopted arena (CudaDevice, which only reads it). `fd` stays the caller's (it
  // may close it at once: the import holds the memory), so this segment has no descriptor to export.
  static VmmSegment import(CUdevice dev, int fd, uint64_t size);
  // As import, mapped read-write: for the daemon alone, writing a final allocation of an update
  // that it made earlier and kept by descriptor (no other process is ever handed that descriptor).
  static VmmSegment importWritable(CUdevice dev, int fd, uint64_t size);

  CUdeviceptr pointer() const { return pointer_; }
  uint64_t size() const { return size_; }
  // The segment's descriptor, exported on the first call; owned by the segment (the caller dups
  // what it hands on), so repeated exports hand out the same one and nothing leaks.
  int exportFd();
  void reset();

 private:
  void importFrom(int fd);
  // Reserve, map and grant `flags` access for `dev`, each recorded as it succeeds so reset()
  // undoes just those.
  void mapOn(CUdevice dev, CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  CUmemGenericAllocationHandle handle_ = 0;
  bool haveHandle_ = false;
  CUdeviceptr pointer_ = 0;  // the reserved range; 0 when none
  bool mapped_ = false;
  uint64_t size_ = 0;
  int fd_ = -1;
};

}  // namespace weightd
