// A fill running on its own native thread. JS polls status() instead of being called back:
// a worker thread can be terminated at any moment, and a poll leaves nothing for a dying
// environment to call into, while the destructor's join guarantees no thread outlives the
// device memory it writes.
#pragma once
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

#include "device.h"

namespace weightd {

struct FillStatus {
  bool done = false;
  bool failed = false;
  bool waitingForGroup = false;
  std::string errorCode;
  std::string errorMessage;
  uint64_t bytes = 0;
  double seconds = 0;
};

class FillJob {
 public:
  // Throws E_THREAD_CREATE when its thread cannot start.
  FillJob(std::shared_ptr<Device> device, std::vector<std::string> files, std::vector<CopyOp> ops, std::vector<ZeroRange> zeros,
          FillOptions options);
  ~FillJob();  // cancels and joins
  FillStatus status();
  void cancel() { control_.cancel = true; }

 private:
  std::shared_ptr<Device> device_;
  FillControl control_;
  std::mutex mutex_;
  FillStatus result_;
  std::chrono::steady_clock::time_point started_;
  std::thread thread_;
};

}  // namespace weightd
