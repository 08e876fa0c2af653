// The host backend: each segment is a shared-memory file (0600, created exclusively) mapped
// into this process; a client maps the same file by path. A real backend, not a mock:
// everything above the addon runs unchanged on it, on machines with no GPU.
#pragma once
#include <mutex>

#include "device.h"

namespace weightd {

class HostDevice : public Device {
 public:
  // `shmDir` holds the segment files (normally /dev/shm); `uuid` is the stable device id.
  HostDevice(int index, std::string uuid, std::string shmDir);
  ~HostDevice() override;
  DeviceInfo info() override;
  void allocate(const std::vector<uint64_t>& segmentBytes) override;
  void fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
            const std::vector<ZeroRange>& zeros, const FillOptions& options, FillControl& control) override;
  std::vector<SegmentExport> exportSegments() override;
  void read(uint32_t segment, uint64_t offset, uint64_t length, void* dst) override;
  void free() override;

 private:
  struct Segment {
    std::string path;
    int fd = -1;
    void* base = nullptr;
    uint64_t bytes = 0;
  };
  void freeLocked();
  int index_;
  std::string uuid_;
  std::string shmDir_;
  std::mutex mutex_;
  std::vector<Segment> segments_;
};

}  // namespace weightd
