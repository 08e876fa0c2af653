#include "device_factory.h"

#include <unistd.h>

#include "cuda_device.h"
#include "host_device.h"

namespace weightd {

namespace {

// STAND-IN until branch memfd lands (its HostDevice implements adopt): drop this class at that
// merge and make HostDevice again. It keeps this branch building with Device::adopt pure virtual.
class HostDeviceUntilMemfd final : public HostDevice {
 public:
  using HostDevice::HostDevice;
  void adopt(const std::vector<int>& fds, const std::vector<uint64_t>&) override {
    for (int fd : fds) ::close(fd);
    throw DeviceError("E_UNSUPPORTED", "the host backend cannot adopt descriptors on this build");
  }
};

}  // namespace

std::shared_ptr<Device> makeDevice(const std::string& backend, int index, const DeviceOptions& options) {
  if (backend == "host") return std::make_shared<HostDeviceUntilMemfd>(index, options.uuid, options.shmDir);
  // For cuda, a given uuid is the one the device must have (see CudaDevice); shmDir is unused.
  if (backend == "cuda") {
    CudaHandles handles = options.cudaHandles.empty() ? CudaHandles::Ipc : parseCudaHandles(options.cudaHandles);
    return std::make_shared<CudaDevice>(index, options.uuid, handles);
  }
  throw DeviceError("E_BAD_BACKEND", "unknown device backend '" + backend + "'; use 'host' or 'cuda'");
}

}  // namespace weightd
