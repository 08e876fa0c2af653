// The CUDA backend: one GPU's arena (one allocation per segment) in the device's primary
// context, filled from checkpoint files by the copy engine in cuda_copy_engine.h. With
// CudaHandles::Ipc (the default) each segment is a cuMemAlloc exported as a legacy CUDA IPC
// handle, which PyTorch's cudaIpcOpenMemHandle opens; with CudaHandles::Fd it is VMM memory
// (cuda_vmm.h) exported as a POSIX file descriptor, handle "cuda-fd", which also lets a later
// process adopt() the arena without filling it.
#pragma once
#include <memory>
#include <mutex>
#include <utility>

#include "cuda_resources.h"
#include "cuda_vmm.h"
#include "device.h"

namespace weightd {

class CudaDevice : public Device {
 public:
  // `index` is the ordinal among the devices this process sees. A non-empty `expectedUuid`
  // must match the device's, so a plan made for one GPU never lands on another (for example
  // when CUDA_VISIBLE_DEVICES differs between the process that planned and this one).
  // With CudaHandles::Fd a GPU that cannot export VMM memory as a descriptor fails here, naming why.
  // `deferContext`: the primary context is retained on the first call that needs one, not here,
  // so a device that only adopts and exports descriptors makes none (a restart's fast path,
  // src/actors/adoptHere.ts): adopt() then holds the descriptors unmapped until checkAdopted().
  CudaDevice(int index, const std::string& expectedUuid, CudaHandles handles = CudaHandles::Ipc, bool deferContext = false);
  ~CudaDevice() override;
  DeviceInfo info() override;
  void allocate(const std::vector<uint64_t>& segmentBytes) override;
  void fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
            const std::vector<ZeroRange>& zeros, const std::vector<TensorRange>& tensors, const FillOptions& options,
            FillControl& control) override;
  std::vector<SegmentExport> exportSegments() override;
  // Takes descriptors another device exported with CudaHandles::Fd (any handles setting: adopted
  // memory is VMM memory either way, and is exported as "cuda-fd" again, the same descriptor
  // numbers for the device's life). With a context it maps them at once (checkAdopted), so a
  // descriptor that is not this GPU's allocation of the planned size fails here; a device
  // whose context is deferred holds them unmapped. fill() then refuses.
  void adopt(const std::vector<int>& fds, const std::vector<uint64_t>& segmentBytes) override;
  // Imports and maps every adopted descriptor not mapped yet, retaining the context: the check
  // that each is a VMM allocation a client of this GPU can map at the planned size (the client
  // runs the same import). A failure names the segment and leaves the descriptors held (free()
  // closes them), so the numbers exported stay valid and are never reused while served.
  void checkAdopted() override;
  void read(uint32_t segment, uint64_t offset, uint64_t length, void* dst) override;
  // Frees the arena and drops this device's reference on the primary context.
  void free() override;

 private:
  // An adopted descriptor, owned: closed when its segment goes.
  class HeldFd {
   public:
    explicit HeldFd(int fd = -1) : fd_(fd) {}
    ~HeldFd();
    HeldFd(HeldFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    HeldFd& operator=(HeldFd&& other) noexcept;
    int get() const { return fd_; }

   private:
    int fd_;
  };
  // One of `memory` (ipc) and `vmm` (fd, or adopted) holds the segment. An adopted segment also
  // holds the descriptor it came as (`adopted`), which is what it exports; `vmm` is its mapping
  // here, made by checkAdopted (none yet on a device whose context is deferred).
  struct Segment {
    DeviceMemory memory;
    VmmSegment vmm;
    HeldFd adopted;
    uint64_t bytes = 0;
    CUdeviceptr base() const { return vmm.pointer() ? vmm.pointer() : memory.get(); }
  };
  // The context, retained on first use after construction or free().
  CUcontext contextLocked();
  void freeLocked();
  void mapAdoptedLocked();
  // "GPU 1 (GPU-uuid)": how errors name this device.
  std::string label() const;
  // Runs `fn` and prefixes any DeviceError with which GPU it happened on.
  template <typename Fn>
  auto onDevice(Fn fn) -> decltype(fn());

  const int index_;
  const CudaHandles handles_;
  const bool deferContext_;
  DeviceInfo identity_;  // uuid, name, total memory: fixed for the life of the device
  std::mutex mutex_;
  std::unique_ptr<PrimaryContext> context_;
  // Declared after context_ so they are freed first; free() also frees them explicitly.
  std::vector<Segment> segments_;
  // The arena came from adopt(): its bytes are someone else's fill, so fill() refuses.
  bool adopted_ = false;
};

}  // namespace weightd
