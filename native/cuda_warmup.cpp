#include "cuda_warmup.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_driver.h"
#include "cuda_resources.h"

namespace weightd {

namespace {

std::mutex warmMutex;
// Never destroyed: at exit, releasing into a driver being torn down is no use (and a reference
// still held then shows as a leak in the fake driver's report, which the tests read).
auto& warmContexts = *new std::vector<std::unique_ptr<PrimaryContext>>();
bool ended = false;  // a reference taken after endWarmContexts() is dropped at once

}  // namespace

void warmCuda(int devices) {
  CudaProbe probe = probeCuda();  // cuInit, once per process
  if (!probe.available) return;
  int n = std::min(devices, static_cast<int>(probe.devices.size()));
  for (int i = 0; i < n; ++i) {
    try {
      auto ctx = std::make_unique<PrimaryContext>(i);
      std::lock_guard<std::mutex> lock(warmMutex);
      if (ended) return;
      warmContexts.push_back(std::move(ctx));
    } catch (const DeviceError&) {
      return;  // the rank that needs this GPU reports it
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
}

}  // namespace weightd
