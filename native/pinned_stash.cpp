#include "pinned_stash.h"

#include <mutex>

#include "device.h"

namespace weightd {

namespace {

std::mutex stashMutex;
// Never destroyed: at exit, freeing into a driver being torn down is no use.
auto& stashed = *new PinnedHostMemory();
uint64_t stashedBytes = 0;
bool dropped = false;

}  // namespace

void stashPinned(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(stashMutex);
    if (dropped || stashed.get()) return;
  }
  PinnedHostMemory block;
  try {
    block = allocatePinnedHost(bytes);
  } catch (const DeviceError&) {
    return;
  }
  std::lock_guard<std::mutex> lock(stashMutex);
  if (dropped || stashed.get()) return;  // freed here, by block's destructor
  stashed = std::move(block);
  stashedBytes = bytes;
}

PinnedHostMemory takeStashedPinned(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(stashMutex);
  if (!stashed.get() || stashedBytes < bytes) return PinnedHostMemory();
  stashedBytes = 0;
  return std::move(stashed);
}

void dropStashedPinned() {
  PinnedHostMemory freed;
  std::lock_guard<std::mutex> lock(stashMutex);
  dropped = true;
  freed = std::move(stashed);
  stashedBytes = 0;
}

}  // namespace weightd
