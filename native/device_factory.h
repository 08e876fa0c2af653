#pragma once
#include <memory>

#include "device.h"

namespace weightd {

struct DeviceOptions {
  std::string uuid;         // host: the stable id to report
  std::string cudaHandles;  // cuda: "ipc" (default when empty) or "fd" (cuda_vmm.h)
  bool deferContext = false;  // cuda: retain the context on first need (CudaDevice)
};

// The one place that knows which backends exist.
std::shared_ptr<Device> makeDevice(const std::string& backend, int index, const DeviceOptions& options);

}  // namespace weightd
