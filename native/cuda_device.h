// The CUDA backend: one GPU's arena (one allocation per segment) in the device's primary
// context, filled from checkpoint files by the copy engine in cuda_copy_engine.h. With
// CudaHandles::Ipc (the default) each segment is a cuMemAlloc exported as a legacy CUDA IPC
// handle, which PyTorch's cudaIpcOpenMemHandle opens; with CudaHandles::Fd it is VMM memory
// (cuda_vmm.h) exported as a POSIX file descriptor, handle "cuda-fd", which also lets a later
// process adopt() the arena without filling it.
#pragma once
#include <memory>
#include <mutex>

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
  CudaDevice(int index, const std::string& expectedUuid, CudaHandles handles = CudaHandles::Ipc);
  ~CudaDevice() override;
  DeviceInfo info() override;
  void allocate(const std::vector<uint64_t>& segmentBytes) override;
  void fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
            const std::vector<ZeroRange>& zeros, const std::vector<TensorRange>& tensors, const FillOptions& options,
            FillControl& control) override;
  std::vector<SegmentExport> exportSegments() override;
  // Maps descriptors another device exported with CudaHandles::Fd (any handles setting: adopted
  // memory is VMM memory either way, and is exported as "cuda-fd" again). fill() then refuses.
  void adopt(const std::vector<int>& fds, const std::vector<uint64_t>& segmentBytes) override;
  void read(uint32_t segment, uint64_t offset, uint64_t length, void* dst) override;
  // Frees the arena and drops this device's reference on the primary context.
  void free() override;

 private:
  // One of `memory` (ipc) and `vmm` (fd, or adopted) holds the segment.
  struct Segment {
    DeviceMemory memory;
    VmmSegment vmm;
    uint64_t bytes = 0;
    CUdeviceptr base() const { return vmm.pointer() ? vmm.pointer() : memory.get(); }
  };
  // The context, retained on first use after construction or free().
  CUcontext contextLocked();
  void freeLocked();
  // "GPU 1 (GPU-uuid)": how errors name this device.
  std::string label() const;
  // Runs `fn` and prefixes any DeviceError with which GPU it happened on.
  template <typename Fn>
  auto onDevice(Fn fn) -> decltype(fn());

  const int index_;
  const CudaHandles handles_;
  DeviceInfo identity_;  // uuid, name, total memory: fixed for the life of the device
  std::mutex mutex_;
  std::unique_ptr<PrimaryContext> context_;
  // Declared after context_ so they are freed first; free() also frees them explicitly.
  std::vector<Segment> segments_;
  // The arena came from adopt(): its bytes are someone else's fill, so fill() refuses.
  bool adopted_ = false;
};

}  // namespace weightd
