#include "cuda_warmup.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_digest_kernels.h"
#include "cuda_driver.h"
#include "cuda_resources.h"
#include "pinned_stash.h"

namespace weightd {

namespace {

std::mutex warmMutex;
// Never destroyed: at exit, releasing into a driver being torn down is no use (and a reference
// still held then shows as a leak in the fake driver's report, which the tests read).
auto& warmContexts = *new std::vector<std::unique_ptr<PrimaryContext>>();
bool ended = false;  // a reference taken after endWarmContexts() is dropped at once

}  // namespace

void warmCuda(int devices, uint64_t stagingBytes) {
  CudaProbe probe = probeCuda();  // cuInit, once per process
  if (!probe.available) return;
  int n = std::min(devices, static_cast<int>(probe.devices.size()));
  int made = 0;
  for (; made < n; ++made) {
    try {
      auto ctx = std::make_unique<PrimaryContext>(made);
      std::lock_guard<std::mutex> lock(warmMutex);
      if (ended) return;
      warmContexts.push_back(std::move(ctx));
    } catch (const DeviceError&) {
      break;  // the rank that needs this GPU reports it
    }
  }
  if (made == 0) return;
  if (stagingBytes > 0) {
    try {
      // Pinned with GPU 0's context current (PORTABLE: every context copies from it), retained
      // here for the call: endWarmContexts() may drop the warm-up's own reference meanwhile.
      PrimaryContext context(0);
      ScopedContext current(context.get());
      stashPinned(stagingBytes);
    } catch (const DeviceError&) {
      // A fill pins its own.
    }
  }
  // After the staging, which the first fill needs first: each context's digest kernels, so that
  // a fill that hashes on the GPU finds them loaded (~0.5 ms of its setup otherwise). Only in
  // the contexts the warm-up still holds, under its lock: endWarmContexts() waits for one load at
  // most, and no context is made again for it.
  for (int d = 0; d < made; ++d) {
    std::lock_guard<std::mutex> lock(warmMutex);
    if (ended || static_cast<size_t>(d) >= warmContexts.size()) return;
    try {
      ScopedContext current(warmContexts[d]->get());
      preloadDigestKernels();
    } catch (const DeviceError&) {
      // The fill loads them, or hashes on the CPU, saying why.
    }
  }
}

void endWarmContexts() {
  std::vector<std::unique_ptr<PrimaryContext>> dropped;
  {
    std::lock_guard<std::mutex> lock(warmMutex);
    ended = true;
    dropped.swap(warmContexts);
  }
  // The staging no fill took is freed with a context current (the driver wants one), before the
  // warm-up's references go.
  if (dropped.empty()) return dropStashedPinned();
  ScopedContext current(dropped[0]->get());
  dropStashedPinned();
}

}  // namespace weightd
