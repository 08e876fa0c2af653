// RAII owners of CUDA driver resources. Destructors also run on failure paths, where the first
// error is already on its way to the caller, so they use raw() and ignore results. Anything
// that belongs to a context is destroyed while that context is current (ScopedContext).
#pragma once
#include <utility>

#include "cuda_driver.h"

namespace weightd {

// Owns one driver handle and destroys it once; move-only.
template <typename T, void (*Destroy)(T)>
class Unique {
 public:
  Unique() = default;
  explicit Unique(T value) : value_(value) {}
  ~Unique() { reset(); }
  Unique(Unique&& other) noexcept : value_(std::exchange(other.value_, T{})) {}
  Unique& operator=(Unique&& other) noexcept {
    if (this != &other) {
      reset();
      value_ = std::exchange(other.value_, T{});
    }
    return *this;
  }
  Unique(const Unique&) = delete;
  Unique& operator=(const Unique&) = delete;
  T get() const { return value_; }
  void reset() {
    if (value_ != T{}) Destroy(std::exchange(value_, T{}));
  }

 private:
  T value_{};
};

namespace cuda_destroy {
inline void deviceMemory(CUdeviceptr p) { cudaDriver().cuMemFree_v2.raw(p); }
inline void pinnedHost(void* p) { cudaDriver().cuMemFreeHost.raw(p); }
// Work still queued on a stream may read staging memory that is about to be freed: drain it.
inline void stream(CUstream s) {
  cudaDriver().cuStreamSynchronize.raw(s);
  cudaDriver().cuStreamDestroy_v2.raw(s);
}
inline void event(CUevent e) { cudaDriver().cuEventDestroy_v2.raw(e); }
inline void ipcMapping(CUdeviceptr p) { cudaDriver().cuIpcCloseMemHandle.raw(p); }
}  // namespace cuda_destroy

using DeviceMemory = Unique<CUdeviceptr, cuda_destroy::deviceMemory>;
using PinnedHostMemory = Unique<void*, cuda_destroy::pinnedHost>;
using Stream = Unique<CUstream, cuda_destroy::stream>;
using Event = Unique<CUevent, cuda_destroy::event>;
using IpcMapping = Unique<CUdeviceptr, cuda_destroy::ipcMapping>;

inline DeviceMemory allocateDeviceMemory(uint64_t bytes) {
  CUdeviceptr p = 0;
  cudaDriver().cuMemAlloc_v2(&p, bytes);
  return DeviceMemory(p);
}

// PORTABLE: pinned for every context in the process, so one staging buffer feeds several GPUs.
inline PinnedHostMemory allocatePinnedHost(uint64_t bytes) {
  void* p = nullptr;
  cudaDriver().cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE);
  return PinnedHostMemory(p);
}

// Non-blocking: these streams never wait for (or hold up) work on the legacy default stream,
// which other code in the process may use.
inline Stream createStream() {
  CUstream s = nullptr;
  cudaDriver().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  return Stream(s);
}

// Blocking sync: a thread waiting for its staging buffer sleeps instead of spinning a core that
// another reader needs (two GPUs' fills share the host's cores).
inline Event createEvent() {
  CUevent e = nullptr;
  cudaDriver().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
  return Event(e);
}

// One reference on a device's primary context: the context every library in the process (the
// CUDA runtime, PyTorch) shares for that device, so weightd never creates a second one.
class PrimaryContext {
 public:
  explicit PrimaryContext(int index) : device_(cudaDeviceAt(index)) {
    cudaDriver().cuDevicePrimaryCtxRetain(&context_, device_);
  }
  ~PrimaryContext() { cudaDriver().cuDevicePrimaryCtxRelease_v2.raw(device_); }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  CUcontext get() const { return context_; }

 private:
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

// Makes a context current on this thread for a scope and restores what was current before,
// so a JS thread that also talks to another device (or PyTorch) is left as it was found.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext context) { cudaDriver().cuCtxPushCurrent_v2(context); }
  ~ScopedContext() {
    CUcontext popped = nullptr;
    cudaDriver().cuCtxPopCurrent_v2.raw(&popped);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
};

}  // namespace weightd
