// The host backend: each segment is an anonymous memfd (no name in any directory, so nothing is
// left behind by a crash and no name can be squatted) mapped into this process. Export seals it
// read-only and hands out its descriptor; a client maps what it receives over the socket
// (SCM_RIGHTS), and adopt() takes descriptors another process sealed. A real backend, not a
// mock: everything above the addon runs unchanged on it, on machines with no GPU.
#pragma once
#include <mutex>

#include "device.h"

namespace weightd {

class HostDevice : public Device {
 public:
  // `uuid` is the stable device id.
  HostDevice(int index, std::string uuid);
  ~HostDevice() override;
  DeviceInfo info() override;
  void allocate(const std::vector<uint64_t>& segmentBytes) override;
  void fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
            const std::vector<ZeroRange>& zeros, const std::vector<TensorRange>& tensors, const FillOptions& options,
            FillControl& control) override;
  std::vector<SegmentExport> exportSegments() override;
  void adopt(const std::vector<int>& fds, const std::vector<uint64_t>& segmentBytes) override;
  void read(uint32_t segment, uint64_t offset, uint64_t length, void* dst) override;
  void free() override;

 private:
  struct Segment {
    int fd = -1;
    void* base = nullptr;  // RW until sealed, then RO
    uint64_t bytes = 0;
  };
  void freeLocked();
  void sealLocked();
  int index_;
  std::string uuid_;
  std::mutex mutex_;
  std::vector<Segment> segments_;
  // Sealed (exported, or adopted): the bytes can no longer change, by us or anyone.
  bool sealed_ = false;
};

}  // namespace weightd
