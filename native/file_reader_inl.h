#pragma once
#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "start_thread.h"

namespace weightd {

template <typename Work>
void runChunks(size_t chunkCount, unsigned threads, FillProgress& progress, Work work) {
  std::atomic<size_t> next{0};
  std::exception_ptr firstError;
  std::mutex errorMutex;
  auto loop = [&]() {
    while (!progress.cancel.load(std::memory_order_relaxed)) {
      size_t i = next.fetch_add(1);
      if (i >= chunkCount) return;
      try {
        work(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (!firstError) firstError = std::current_exception();
        // Stop the other readers: the fill has failed and its memory will be freed.
        progress.cancel = true;
        return;
      }
    }
  };
  unsigned n = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(chunkCount)));
  std::vector<std::thread> pool;
  pool.reserve(n);
  for (unsigned t = 1; t < n; ++t) {
    try {
      pool.push_back(startThread("reader thread " + std::to_string(t + 1) + " of " + std::to_string(n), loop));
    } catch (const DeviceError&) {
      // The threads already started must stop and be joined before the error leaves.
      progress.cancel = true;
      for (auto& thread : pool) thread.join();
      throw;
    }
  }
  loop();
  for (auto& t : pool) t.join();
  if (firstError) std::rethrow_exception(firstError);
  if (progress.cancel) throw DeviceError("E_FILL_CANCELLED", "fill cancelled before it finished");
}

}  // namespace weightd
