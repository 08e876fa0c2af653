// The CUDA driver API, opened with dlopen at run time. cuda.h supplies types and prototypes
// only: the addon never links libcuda, so it loads (and the host backend works) on machines
// with no NVIDIA driver, and a missing driver becomes a clear error instead of a load failure.
#pragma once
#include <cuda.h>

#include <string>
#include <vector>

#include "device.h"

namespace weightd {

// The DeviceError for a failed driver call: the call's name, the driver's name for the result
// and its message. Out-of-memory results get E_OUT_OF_MEMORY, everything else E_CUDA.
DeviceError cudaError(const char* call, CUresult result);

// One resolved entry point. Calling it checks the result, so no driver call can go unchecked;
// raw() is for destructors (which must not throw) and for results that are not failures.
template <typename Fn>
class DriverFn;

template <typename... Args>
class DriverFn<CUresult (*)(Args...)> {
 public:
  void bind(void* symbol, const char* name) {
    fn_ = reinterpret_cast<CUresult (*)(Args...)>(symbol);
    name_ = name;
  }
  void operator()(Args... args) const {
    CUresult r = fn_(args...);
    if (r != CUDA_SUCCESS) throw cudaError(name_, r);
  }
  CUresult raw(Args... args) const { return fn_(args...); }

 private:
  CUresult (*fn_)(Args...) = nullptr;
  const char* name_ = "";
};

// Every entry point weightd uses, by the versioned symbol cuda.h maps each name to (dlsym sees
// no macros): one list drives both the members and their resolution. The virtual memory calls
// (cuMemCreate and the rest, for --cuda-handles fd) date from CUDA 10.2, older than the oldest
// driver weightd supports, so they are required like the others; whether a GPU supports them is
// a device attribute (cuda_vmm.h).
#define WEIGHTD_CUDA_ENTRY_POINTS(X)                                                                 \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount)           \
  X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetUuid_v2) X(cuDeviceTotalMem_v2)                      \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuCtxPushCurrent_v2)                 \
  X(cuCtxPopCurrent_v2) X(cuCtxGetCurrent) X(cuCtxGetId) X(cuMemGetInfo_v2) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemGetAddressRange_v2) \
  X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostRegister_v2) X(cuMemHostUnregister)                   \
  X(cuMemcpyHtoD_v2) X(cuMemcpyHtoDAsync_v2) X(cuMemcpy2DAsync_v2) X(cuMemcpyDtoDAsync_v2) X(cuMemcpyDtoH_v2) X(cuMemsetD8Async) X(cuMemsetD32Async) \
  X(cuStreamCreate) X(cuStreamSynchronize) X(cuStreamDestroy_v2) X(cuEventCreate) X(cuEventRecord)    \
  X(cuEventSynchronize) X(cuEventDestroy_v2) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2)            \
  X(cuIpcCloseMemHandle) X(cuDeviceGetAttribute) X(cuMemGetAllocationGranularity) X(cuMemCreate)      \
  X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) X(cuModuleLoadData) X(cuModuleUnload) \
  X(cuModuleGetFunction) X(cuLaunchKernel) X(cuStreamWaitEvent)

struct CudaDriver {
#define WEIGHTD_DECLARE_ENTRY(name) DriverFn<decltype(&::name)> name;
  WEIGHTD_CUDA_ENTRY_POINTS(WEIGHTD_DECLARE_ENTRY)
#undef WEIGHTD_DECLARE_ENTRY
  int driverVersion = 0;  // e.g. 13000 for CUDA 13.0
};

// The process's driver, loaded and initialised (cuInit) once: the driver is per process, so this
// is process state, not JS state. Throws E_CUDA_UNAVAILABLE with the reason when there is none.
const CudaDriver& cudaDriver();

struct CudaProbe {
  bool available = false;
  std::string reason;  // why not available; empty when it is
  int driverVersion = 0;
  std::vector<DeviceInfo> devices;  // freeBytes is 0: measuring it needs a context
  // Per device, why it cannot serve --cuda-handles fd ("" when it can): see cuda_vmm.h.
  std::vector<std::string> fdHandlesUnsupported;
};

// What CUDA offers this process, without creating any context, taken once per process (the
// devices it sees are fixed at cuInit). Never throws for a missing driver or a device-less
// machine: that is what `available` and `reason` are for.
CudaProbe probeCuda();

// Ordinal, nvidia-smi style UUID ("GPU-xxxxxxxx-..."), name and total memory of one visible
// device. Needs no context.
DeviceInfo describeCudaDevice(int index);

// The CUdevice for a visible ordinal (the driver applies CUDA_VISIBLE_DEVICES); E_NO_DEVICE
// names how many devices this process sees when the ordinal is out of range.
CUdevice cudaDeviceAt(int index);

}  // namespace weightd
