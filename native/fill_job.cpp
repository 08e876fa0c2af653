#include "fill_job.h"

#include "start_thread.h"

namespace weightd {

FillJob::FillJob(std::shared_ptr<Device> device, std::vector<std::string> files, std::vector<CopyOp> ops,
                 std::vector<ZeroRange> zeros, std::vector<TensorRange> tensors, FillOptions options)
    : device_(std::move(device)), started_(std::chrono::steady_clock::now()) {
  thread_ = startThread("the fill thread", [this, files = std::move(files), ops = std::move(ops), zeros = std::move(zeros),
                                            tensors = std::move(tensors), options]() {
    FillStatus r;
    try {
      device_->fill(files, ops, zeros, tensors, options, control_);
      r.digests = std::move(control_.digests);
      r.digestRereadBytes = control_.digestRereadBytes;
      r.rowsDeliveredBytes = control_.rowsDeliveredBytes;
      r.rowsReceivedBytes = control_.rowsReceivedBytes;
      r.digestGpuBytes = control_.digestGpuBytes;
      r.digestGpuUnavailable = control_.digestGpuUnavailable;
      r.digestGpuSetupSeconds = control_.digestGpuSetupSeconds;
      r.digestGpuTailSeconds = control_.digestGpuTailSeconds;
      r.stagingSeconds = control_.stagingSeconds;
      r.stagingPinnedAhead = control_.stagingPinnedAhead;
    } catch (const DeviceError& e) {
      r.failed = true;
      r.errorCode = e.code();
      r.errorMessage = e.what();
    } catch (const std::exception& e) {
      r.failed = true;
      r.errorCode = "E_INTERNAL";
      r.errorMessage = e.what();
    }
    r.done = true;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    std::lock_guard<std::mutex> lock(mutex_);
    result_ = r;
  });
}

FillJob::~FillJob() { stop(); }

void FillJob::stop() {
  control_.cancel = true;
  std::lock_guard<std::mutex> lock(joinMutex_);
  if (thread_.joinable()) thread_.join();
}

FillStatus FillJob::status() {
  std::lock_guard<std::mutex> lock(mutex_);
  FillStatus s = result_;
  s.bytes = control_.bytes.load();
  s.waitingForGroup = control_.waitingForGroup.load();
  if (!s.done) s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return s;
}

}  // namespace weightd
