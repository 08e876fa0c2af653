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
  std::vector<std::string> digests;  // once done: FillControl.digests
  uint64_t digestRereadBytes = 0;    // once done: FillControl.digestRereadBytes
  uint64_t rowsDeliveredBytes = 0;   // once done: FillControl.rowsDeliveredBytes
  uint64_t rowsReceivedBytes = 0;    // once done: FillControl.rowsReceivedBytes
  uint64_t digestGpuBytes = 0;       // once done: FillControl.digestGpuBytes
  std::string digestGpuUnavailable;  // once done: FillControl.digestGpuUnavailable
  double digestGpuSetupSeconds = 0;  // once done: FillControl.digestGpuSetupSeconds
  double digestGpuTailSeconds = 0;   // once done: FillControl.digestGpuTailSeconds
  double stagingSeconds = 0;         // once done: FillControl.stagingSeconds
  bool stagingPinnedAhead = false;   // once done: FillControl.stagingPinnedAhead
};

class FillJob {
 public:
  // Throws E_THREAD_CREATE when its thread cannot start.
  FillJob(std::shared_ptr<Device> device, std::vector<std::string> files, std::vector<CopyOp> ops, std::vector<ZeroRange> zeros,
          std::vector<TensorRange> tensors, FillOptions options);
  ~FillJob();  // stop()
  // Cancels the fill and waits for its thread. Idempotent and safe from several threads at once
  // (the second caller waits for the first's join): a free() on a libuv thread and the addon's
  // teardown on the JS thread may both stop the same fill, and neither may free memory before.
  void stop();
  FillStatus status();
  void cancel() { control_.cancel = true; }

 private:
  std::shared_ptr<Device> device_;
  FillControl control_;
  std::mutex mutex_;
  FillStatus result_;
  std::chrono::steady_clock::time_point started_;
  std::mutex joinMutex_;
  std::thread thread_;
};

}  // namespace weightd
