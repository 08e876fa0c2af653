#include "cuda_warmup.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

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
  CUcontext first = nullptr;
  for (int i = 0; i < n; ++i) {
    try {
      auto ctx = std::make_unique<PrimaryContext>(i);
      std::lock_guard<std::mutex> lock(warmMutex);
      if (ended) return;
      if (i == 0) first = ctx->get();
      warmContexts.push_back(std::move(ctx));
    } catch (const DeviceError&) {
      break;  // the rank that needs this GPU reports it
    }
  }
  // Pinned with GPU 0's context current (PORTABLE: every context copies from it), which the
  // warm-up holds until endWarmContexts() has dropped the stash.
  if (first && stagingBytes > 0) {
    ScopedContext current(first);
    stashPinned(stagingBytes);
  }
}

void endWarmContexts() {
  dropStashedPinned();  // before the contexts, one of which pinned it
  std::vector<std::unique_ptr<PrimaryContext>> dropped;
  {
    std::lock_guard<std::mutex> lock(warmMutex);
    ended = true;
    dropped.swap(warmContexts);
  }
}

}  // namespace weightd
