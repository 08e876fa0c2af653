#include "cuda_driver.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "cuda_vmm.h"

namespace weightd {

namespace {

struct DriverState {
  CudaDriver driver;
  bool available = false;
  std::string reason;
};

DeviceError describeFailure(const CudaDriver& drv, const char* call, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  drv.cuGetErrorName.raw(result, &name);
  drv.cuGetErrorString.raw(result, &text);
  std::string message = std::string(call) + " failed: " + (name ? name : "CUDA error " + std::to_string(result)) +
                        (text ? std::string(" (") + text + ")" : "");
  if (result == CUDA_ERROR_OUT_OF_MEMORY) return DeviceError("E_OUT_OF_MEMORY", message);
  return DeviceError("E_CUDA", message);
}

// Loaded once per process and never unloaded: the driver keeps threads and state that must
// outlive every context, and dlclose of libcuda is not supported.
const DriverState& driverState() {
  static DriverState state;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      state.reason = std::string("libcuda.so.1 not found: no NVIDIA driver on this machine (") + (why ? why : "dlopen failed") +
                     "); install the driver or use the host backend";
      return;
    }
    std::string missing;
#define WEIGHTD_RESOLVE_ENTRY(name)                        \
  if (void* sym = dlsym(lib, #name)) {                     \
    state.driver.name.bind(sym, #name);                    \
  } else {                                                 \
    missing += missing.empty() ? #name : ", " #name;       \
  }
    WEIGHTD_CUDA_ENTRY_POINTS(WEIGHTD_RESOLVE_ENTRY)
#undef WEIGHTD_RESOLVE_ENTRY
    if (!missing.empty()) {
      state.reason = "libcuda.so.1 lacks " + missing + ": the NVIDIA driver is too old; install driver 525 or newer";
      return;
    }
    CUresult r = state.driver.cuInit.raw(0);
    if (r != CUDA_SUCCESS) {
      // Not cudaError(): that waits for this very initialisation to finish.
      state.reason = describeFailure(state.driver, "cuInit", r).what();
      if (r == CUDA_ERROR_NO_DEVICE) state.reason += "; no GPU is visible (check CUDA_VISIBLE_DEVICES)";
      return;
    }
    state.driver.cuDriverGetVersion.raw(&state.driver.driverVersion);
    state.available = true;
  });
  return state;
}

std::string formatUuid(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char buf[64];
  snprintf(buf, sizeof buf, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return buf;
}

}  // namespace

// Checked calls exist only on a driver that loaded, so its error functions are resolved here.
DeviceError cudaError(const char* call, CUresult result) { return describeFailure(driverState().driver, call, result); }

const CudaDriver& cudaDriver() {
  const DriverState& s = driverState();
  if (!s.available) throw DeviceError("E_CUDA_UNAVAILABLE", "CUDA is not available: " + s.reason);
  return s.driver;
}

CUdevice cudaDeviceAt(int index) {
  const CudaDriver& drv = cudaDriver();
  int count = 0;
  drv.cuDeviceGetCount(&count);
  if (index < 0 || index >= count) {
    const char* visible = getenv("CUDA_VISIBLE_DEVICES");
    throw DeviceError("E_NO_DEVICE", "CUDA device " + std::to_string(index) + " does not exist: this process sees " +
                                         std::to_string(count) + " device(s)" +
                                         (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : std::string()) +
                                         "; use an index below " + std::to_string(count));
  }
  CUdevice dev = 0;
  drv.cuDeviceGet(&dev, index);
  return dev;
}

DeviceInfo describeCudaDevice(int index) {
  const CudaDriver& drv = cudaDriver();
  CUdevice dev = cudaDeviceAt(index);
  DeviceInfo d;
  d.backend = "cuda";
  d.index = index;
  CUuuid uuid{};
  drv.cuDeviceGetUuid_v2(&uuid, dev);
  d.uuid = formatUuid(uuid);
  char name[256] = {0};
  drv.cuDeviceGetName(name, sizeof name - 1, dev);
  d.name = name;
  size_t total = 0;
  drv.cuDeviceTotalMem_v2(&total, dev);
  d.totalBytes = total;
  return d;
}

namespace {

CudaProbe probeOnce() {
  CudaProbe p;
  const DriverState& s = driverState();
  if (!s.available) {
    p.reason = s.reason;
    return p;
  }
  p.driverVersion = s.driver.driverVersion;
  try {
    int count = 0;
    s.driver.cuDeviceGetCount(&count);
    for (int i = 0; i < count; ++i) {
      p.devices.push_back(describeCudaDevice(i));
      p.fdHandlesUnsupported.push_back(fdHandlesUnsupported(cudaDeviceAt(i)));
    }
  } catch (const DeviceError& e) {
    p.devices.clear();
    p.fdHandlesUnsupported.clear();
    p.reason = e.what();
    return p;
  }
  p.available = !p.devices.empty();
  if (!p.available) p.reason = "the NVIDIA driver sees no GPU (check CUDA_VISIBLE_DEVICES)";
  return p;
}

}  // namespace

CudaProbe probeCuda() {
  // The devices a process sees are fixed when cuInit runs (CUDA_VISIBLE_DEVICES is read then), so
  // the first probe's answer is every later one's. Taken once: a daemon probes from the launcher,
  // the CUDA warm-up and the node's devices. On an H100 host the node's probe answered 70-90 ms
  // after the control socket at a start that loads, while the warm-up made the primary context,
  // and 4-18 ms after it at a restart with no warm-up (bench/RESULTS.md, issue 33): its queries
  // likely waited in the driver behind that context. Callers meanwhile wait for the first probe,
  // as they would for cuInit.
  static std::once_flag once;
  static CudaProbe probe;
  std::call_once(once, [] { probe = probeOnce(); });
  return probe;
}

}  // namespace weightd
