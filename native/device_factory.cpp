#include "device_factory.h"

#include "cuda_device.h"
#include "host_device.h"

namespace weightd {

std::shared_ptr<Device> makeDevice(const std::string& backend, int index, const DeviceOptions& options) {
  if (backend == "host") return std::make_shared<HostDevice>(index, options.uuid);
  // For cuda, a given uuid is the one the device must have (see CudaDevice).
  if (backend == "cuda") {
    CudaHandles handles = options.cudaHandles.empty() ? CudaHandles::Ipc : parseCudaHandles(options.cudaHandles);
    return std::make_shared<CudaDevice>(index, options.uuid, handles, options.deferContext);
  }
  throw DeviceError("E_BAD_BACKEND", "unknown device backend '" + backend + "'; use 'host' or 'cuda'");
}

}  // namespace weightd
