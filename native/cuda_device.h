// The CUDA backend: one GPU's arena (one cuMemAlloc per segment) in the device's primary
// context, filled from checkpoint files by the copy engine in cuda_copy_engine.h and exported
// as legacy CUDA IPC handles, which PyTorch's cudaIpcOpenMemHandle opens.
#pragma once
#include <memory>
#include <mutex>

#include "cuda_resources.h"
#include "device.h"

namespace weightd {

class CudaDevice : public Device {
 public:
  // `index` is the ordinal among the devices this process sees. A non-empty `expectedUuid`
  // must match the device's, so a plan made for one GPU never lands on another (for example
  // when CUDA_VISIBLE_DEVICES differs between the process that planned and this one).
  CudaDevice(int index, const std::string& expectedUuid);
  ~CudaDevice() override;
  DeviceInfo info() override;
  void allocate(const std::vector<uint64_t>& segmentBytes) override;
  void fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
            const std::vector<ZeroRange>& zeros, const FillOptions& options, FillControl& control) override;
  std::vector<SegmentExport> exportSegments() override;
  // Not yet: legacy IPC memory cannot be passed as a descriptor (VMM, --cuda-handles fd, can).
  void adopt(const std::vector<int>& fds, const std::vector<uint64_t>& segmentBytes) override;
  void read(uint32_t segment, uint64_t offset, uint64_t length, void* dst) override;
  // Frees the arena and drops this device's reference on the primary context.
  void free() override;

 private:
  struct Segment {
    DeviceMemory memory;
    uint64_t bytes = 0;
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
  DeviceInfo identity_;  // uuid, name, total memory: fixed for the life of the device
  std::mutex mutex_;
  std::unique_ptr<PrimaryContext> context_;
  // Declared after context_ so they are freed first; free() also frees them explicitly.
  std::vector<Segment> segments_;
};

}  // namespace weightd
