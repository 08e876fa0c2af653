#include "cuda_pull_plans.h"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>

#include "cuda_prepared_finals.h"
#include "cuda_resources.h"
#include "deferred_release.h"
#include "device.h"

namespace weightd {

namespace {

// A kept PullWork with the primary context it was made in, retained until it goes.
struct KeptPlan {
  explicit KeptPlan(int deviceIndex) : context(deviceIndex) {}
  // The work goes with its context current (its streams, buffers and the opened memory belong to it).
  ~KeptPlan() {
    ScopedContext current(context.get());
    work.reset();
  }
  PrimaryContext context;
  std::mutex running;  // one run at a time: the work's streams and digests are the run's
  std::unique_ptr<PullWork> work;
};

std::mutex tableLock;
std::map<uint32_t, std::shared_ptr<KeptPlan>> table;
uint32_t lastId = 0;

double msSince(std::chrono::steady_clock::time_point t) { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count(); }

}  // namespace

PullPlanMade cudaOpenPullPlan(int deviceIndex, const std::vector<bool>& writes, const std::vector<uint64_t>& bytes, const std::vector<std::string>& sources,
                              const std::vector<CommitCopy>& copies, const std::vector<ZeroRange>& zeros, std::vector<TensorRange> tensors, bool onGpu) {
  auto began = std::chrono::steady_clock::now();
  auto plan = std::make_shared<KeptPlan>(deviceIndex);
  {
    ScopedContext current(plan->context.get());
    plan->work = std::make_unique<PullWork>(deviceIndex, writes, bytes, sources, copies, zeros, std::move(tensors), onGpu);
  }
  PullPlanMade out;
  out.gpuDigestUnavailable = plan->work->gpuDigestUnavailable();
  out.openMs = plan->work->openMs();
  out.setupMs = plan->work->setupMs();
  out.moduleMs = plan->work->moduleMs();
  out.copiedByKernelBytes = plan->work->copiedByKernelBytes();
  std::lock_guard<std::mutex> hold(tableLock);
  do ++lastId;
  while (lastId == 0 || table.count(lastId));
  table.emplace(lastId, std::move(plan));
  out.id = lastId;
  out.totalMs = msSince(began);
  return out;
}

CudaPulled cudaRunPullPlan(uint32_t id, const std::vector<int>& finals, unsigned threads, uint32_t prepared) {
  auto began = std::chrono::steady_clock::now();
  std::shared_ptr<KeptPlan> plan;
  {
    std::lock_guard<std::mutex> hold(tableLock);
    auto it = table.find(id);
    if (it != table.end()) plan = it->second;
  }
  if (!plan) throw DeviceError("E_BAD_PLAN", "pull plan " + std::to_string(id) + " is not kept (closed with its connection, or never made)");
  std::lock_guard<std::mutex> running(plan->running);
  PullWork& work = *plan->work;
  if (finals.size() != work.segments()) {
    throw DeviceError("E_BAD_PLAN", "pull plan " + std::to_string(id) + " writes a layout of " + std::to_string(work.segments()) + " segment(s), not " +
                                        std::to_string(finals.size()));
  }
  std::shared_ptr<const PreparedFinals> kept = preparedFinals(prepared, work.deviceIndex(), finals.size());
  ScopedContext current(plan->context.get());
  auto held = std::make_shared<PullWork::Held>();
  CudaPulled out = work.run(finals, kept.get(), threads, *held);
  // The finals' mappings made here and the run's events go after the reply, as a one-off pull's.
  out.releaseMs = releaseInContext(work.deviceIndex(), [held]() mutable { held.reset(); });
  out.totalMs = msSince(began);
  return out;
}

void cudaClosePullPlan(uint32_t id) {
  std::shared_ptr<KeptPlan> closed;
  {
    std::lock_guard<std::mutex> hold(tableLock);
    auto it = table.find(id);
    if (it == table.end()) return;
    closed = std::move(it->second);
    table.erase(it);
  }
  // After a run in flight (it holds `running`), on the releaser's thread.
  releaseLater([closed]() mutable {
    try {
      { std::lock_guard<std::mutex> wait(closed->running); }
      closed.reset();
    } catch (...) {
    }
  });
}

}  // namespace weightd
