// The reader threads of a fill: a fixed list of work items (the host backend's chunks, the cuda
// copy engine's file windows) taken in order by a bounded number of threads, the calling thread
// being one of them.
#pragma once
#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device.h"
#include "start_thread.h"

namespace weightd {

// Runs `work(item)` for items 0 to itemCount - 1 on up to `threads` threads until every item is
// done, one throws (the first error is rethrown here after all threads stop; the others see
// `cancel` set) or `cancel` is set by anyone (E_FILL_CANCELLED).
template <typename Work>
void runOnReaderThreads(size_t itemCount, unsigned threads, std::atomic<bool>& cancel, Work work) {
  std::atomic<size_t> next{0};
  std::exception_ptr firstError;
  std::mutex errorMutex;
  auto loop = [&]() {
    while (!cancel.load(std::memory_order_relaxed)) {
      size_t i = next.fetch_add(1);
      if (i >= itemCount) return;
      try {
        work(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (!firstError) firstError = std::current_exception();
        // Stop the other readers: the fill has failed and its memory will be freed.
        cancel = true;
        return;
      }
    }
  };
  unsigned n = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(itemCount)));
  std::vector<std::thread> pool;
  pool.reserve(n);
  for (unsigned t = 1; t < n; ++t) {
    try {
      pool.push_back(startThread("reader thread " + std::to_string(t + 1) + " of " + std::to_string(n), loop));
    } catch (const DeviceError&) {
      // The threads already started must stop and be joined before the error leaves.
      cancel = true;
      for (auto& thread : pool) thread.join();
      throw;
    }
  }
  loop();
  for (auto& t : pool) t.join();
  if (firstError) std::rethrow_exception(firstError);
  if (cancel) throw DeviceError("E_FILL_CANCELLED", "fill cancelled before it finished");
}

}  // namespace weightd
