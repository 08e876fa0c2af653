// Node-API bindings: argument checking, conversion to plain C++ data, and errors turned into
// JS errors with a stable `code`. State lives per addon instance (every worker thread loads
// its own), never in globals. Calls that can block (allocate, read, free, the CUDA probe, the
// page-cache scan, reads of another process's CUDA memory) return a Promise and run on a libuv
// thread (PromiseJob).
#include <napi.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "cuda_driver.h"
#include "cuda_warmup.h"
#include "cuda_fill_group.h"
#include "cuda_ipc.h"
#include "device_factory.h"
#include "content_digests.h"
#include "fill_args.h"
#include "fill_job.h"
#include "page_cache.h"
#include "sampled_digest.h"
#include "host_digest_group.h"
#include "host_mapping.h"
#include "peer_credentials.h"
#include "unread_bytes.h"
#include "js_values.h"
#include "unix_fds.h"
#include "update_segments.h"
#include "cuda_segment_digests.h"
#include "cuda_pull_plans.h"
#include "cuda_prepared_finals.h"
#include "cuda_update_segments.h"
#include "deferred_release.h"

namespace weightd {
namespace {

class WeightdAddon;

// A C++ failure as plain data: a DeviceError's code and message; E_INTERNAL for any other
// exception (std::bad_alloc, say).
struct Failure {
  std::string code;
  std::string message;
};

Failure failureOf(const std::exception& e) {
  if (const auto* d = dynamic_cast<const DeviceError*>(&e)) return {d->code(), d->what()};
  return {"E_INTERNAL", e.what()};
}

// Every native failure reaches JS as an error made here: by the factory src/native/addon.ts
// registers (setErrorFactory), so it is an instance of weightd's DeviceError with the C++ code.
// `callSite` is an Error made when an async call was made, so a rejection points at its caller.
Napi::Error makeError(Napi::Env env, const Failure& failure, Napi::Value callSite = Napi::Value());

// The one guarded call: every binding runs inside it (Guarded<> at registration), and a C++
// failure leaves it as a JS error. Napi::Error (a JS exception already made, e.g. an argument's
// TypeError) passes through untouched.
template <typename F>
auto guarded(Napi::Env env, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Napi::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw makeError(env, failureOf(e));
  }
}

// A Promise-returning call, sharp's way: the arguments were checked and copied into `run`'s
// captures (plain C++ data) at the call; run() works on a libuv thread and makes no N-API
// call; done() turns its result into a JS value on the JS thread. `pins` (the receiver, a
// destination buffer) stay referenced, so not collected, until the job has settled; `settled`
// runs on the JS thread first, whatever the outcome (a device's busy mark is cleared there).
template <typename Result>
class PromiseJob : public Napi::AsyncWorker {
 public:
  using Run = std::function<Result()>;
  using Done = std::function<Napi::Value(Napi::Env, const Result&)>;

  static Napi::Promise start(Napi::Env env, Run run, Done done, std::vector<Napi::Object> pins = {},
                             std::function<void()> settled = {}) {
    auto* job = new PromiseJob(env, std::move(run), std::move(done), pins, std::move(settled));  // deletes itself when settled
    Napi::Promise promise = job->deferred_.Promise();
    job->Queue();
    return promise;
  }

  void Execute() override {
    try {
      result_ = run_();
    } catch (const std::exception& e) {
      failure_ = failureOf(e);
    }
  }

  void OnOK() override {
    Napi::Env env = Env();
    if (settled_) settled_();
    if (failure_) {
      deferred_.Reject(makeError(env, *failure_, callSite_.Value()).Value());
      return;
    }
    try {
      deferred_.Resolve(done_(env, result_));
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    }
  }

 private:
  PromiseJob(Napi::Env env, Run run, Done done, const std::vector<Napi::Object>& pins, std::function<void()> settled)
      : Napi::AsyncWorker(env),
        deferred_(Napi::Promise::Deferred::New(env)),
        callSite_(Napi::Persistent(Napi::Error::New(env, "").Value())),
        run_(std::move(run)),
        done_(std::move(done)),
        settled_(std::move(settled)) {
    for (const Napi::Object& o : pins) pins_.push_back(Napi::Persistent(o));
  }

  Napi::Promise::Deferred deferred_;
  Napi::ObjectReference callSite_;
  std::vector<Napi::ObjectReference> pins_;
  Run run_;
  Done done_;
  std::function<void()> settled_;
  Result result_{};
  std::optional<Failure> failure_;
};

// Jobs that only act (allocate, free, read into a caller's buffer) resolve to undefined.
struct Nothing {};
Napi::Value undefinedResult(Napi::Env env, const Nothing&) { return env.Undefined(); }

// The destination of a read: a Uint8Array the caller allocated. Callers read in chunks into
// views of one ArrayBuffer, so a tensor may be larger than any single Buffer or typed array.
Napi::Uint8Array toDestination(const Napi::Value& v) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    throw Napi::TypeError::New(v.Env(), "the destination must be a Uint8Array");
  }
  return v.As<Napi::Uint8Array>();
}

Napi::Object infoToJs(Napi::Env env, const DeviceInfo& d) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("backend", d.backend);
  o.Set("index", d.index);
  o.Set("uuid", d.uuid);
  o.Set("name", d.name);
  o.Set("totalBytes", static_cast<double>(d.totalBytes));
  o.Set("freeBytes", static_cast<double>(d.freeBytes));
  if (!d.freeProbed) o.Set("freeProbed", false);
  return o;
}

class DeviceWrap;

// Shared by the addon instance and its devices so either may go first at environment teardown.
struct Registry {
  std::mutex mutex;
  std::set<DeviceWrap*> live;
};

class DeviceWrap : public Napi::ObjectWrap<DeviceWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Device",
                       {
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::Info>>("info"),
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::Allocate>>("allocate"),
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::StartFill>>("startFill"),
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::FillStatusJs>>("fillStatus"),
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::CancelFill>>("cancelFill"),
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::ExportSegments>>("exportSegments"),
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::Adopt>>("adopt"),
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::CheckAdopted>>("checkAdopted"),
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::Read>>("read"),
                           InstanceMethod<&DeviceWrap::Guarded<&DeviceWrap::Free>>("free"),
                       });
  }

  DeviceWrap(const Napi::CallbackInfo& info);
  ~DeviceWrap() override {
    shutdown();
    if (registry_) {
      std::lock_guard<std::mutex> lock(registry_->mutex);
      registry_->live.erase(this);
    }
  }

  // At environment teardown: stops any fill, its own or one a free() on a libuv thread is still
  // stopping (joining its thread), then frees the device's memory. A job still running holds its
  // own reference to the device, whose lock makes this free wait for it. Safe to call twice.
  void shutdown() {
    job_.reset();
    if (stopping_) stopping_->stop();
    if (device_) device_->free();
  }

 private:
  template <Napi::Value (DeviceWrap::*Method)(const Napi::CallbackInfo&)>
  Napi::Value Guarded(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&] { return (this->*Method)(info); });
  }

  Napi::Value Info(const Napi::CallbackInfo& info) { return infoToJs(info.Env(), device()->info()); }

  // allocate(segmentBytes: number[]) -> Promise<void>
  Napi::Value Allocate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "allocate(segmentBytes: number[])");
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<uint64_t> sizes;
    for (uint32_t i = 0; i < arr.Length(); ++i) sizes.push_back(toU64(arr.Get(i), "segment size"));
    if (sizes.empty()) throw Napi::RangeError::New(env, "allocate needs at least one segment");
    std::shared_ptr<Device> d = device();
    return startJob<Nothing>(info, [d, sizes] { d->allocate(sizes); return Nothing{}; }, undefinedResult);
  }

  Napi::Value StartFill(const Napi::CallbackInfo& info) {
    std::shared_ptr<Device> d = device();
    FillArgs args = fillArgsFromJs(info);
    job_.reset();
    job_ = std::make_unique<FillJob>(d, std::move(args.files), std::move(args.ops), std::move(args.zeros), std::move(args.tensors), args.options);
    return info.Env().Undefined();
  }

  Napi::Value FillStatusJs(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    // A fill a free() is stopping still answers for itself: its poller hears E_FILL_CANCELLED.
    FillJob* job = job_ ? job_.get() : stopping_.get();
    if (!job) throw DeviceError("E_NO_FILL", "no fill has been started on this device");
    FillStatus s = job->status();
    Napi::Object o = Napi::Object::New(env);
    o.Set("done", s.done);
    o.Set("bytes", static_cast<double>(s.bytes));
    o.Set("seconds", s.seconds);
    o.Set("waitingForGroup", s.waitingForGroup);
    if (s.failed) o.Set("error", makeError(env, {s.errorCode, s.errorMessage}).Value());
    if (s.done && !s.failed) {
      Napi::Array digests = Napi::Array::New(env, s.digests.size());
      for (uint32_t i = 0; i < s.digests.size(); ++i) digests.Set(i, s.digests[i]);
      o.Set("digests", digests);
      o.Set("digestRereadBytes", static_cast<double>(s.digestRereadBytes));
      o.Set("rowsDeliveredBytes", static_cast<double>(s.rowsDeliveredBytes));
      o.Set("rowsReceivedBytes", static_cast<double>(s.rowsReceivedBytes));
      o.Set("digestGpuBytes", static_cast<double>(s.digestGpuBytes));
      if (!s.digestGpuUnavailable.empty()) o.Set("digestGpuUnavailable", s.digestGpuUnavailable);
      if (s.digestGpuBytes) {
        o.Set("digestGpuSetupSeconds", s.digestGpuSetupSeconds);
        o.Set("digestGpuTailSeconds", s.digestGpuTailSeconds);
      }
      if (s.stagingSeconds > 0) {
        o.Set("stagingSeconds", s.stagingSeconds);
        o.Set("stagingPinnedAhead", s.stagingPinnedAhead);
      }
    }
    return o;
  }

  Napi::Value CancelFill(const Napi::CallbackInfo& info) {
    if (job_) job_->cancel();
    return info.Env().Undefined();
  }

  Napi::Value ExportSegments(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    std::vector<SegmentExport> segs = device()->exportSegments();
    Napi::Array arr = Napi::Array::New(env, segs.size());
    for (uint32_t i = 0; i < segs.size(); ++i) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("segment", segs[i].segment);
      o.Set("bytes", static_cast<double>(segs[i].bytes));
      o.Set("handle", segs[i].handle);
      if (segs[i].fd >= 0) o.Set("fd", segs[i].fd);
      arr.Set(i, o);
    }
    return arr;
  }

  // adopt(fds: number[], segmentBytes: number[]) -> Promise<void>. The device owns the fds from
  // this call on, so every way it fails, here or in the job, closes them (HostDevice::adopt).
  Napi::Value Adopt(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    std::vector<int> fds;
    try {
      if (!info[0].IsArray() || !info[1].IsArray()) throw Napi::TypeError::New(env, "adopt(fds: number[], segmentBytes: number[])");
      Napi::Array fdArr = info[0].As<Napi::Array>();
      for (uint32_t i = 0; i < fdArr.Length(); ++i) fds.push_back(toBounded<int>(fdArr.Get(i), "fd"));
      Napi::Array sizeArr = info[1].As<Napi::Array>();
      std::vector<uint64_t> sizes;
      for (uint32_t i = 0; i < sizeArr.Length(); ++i) sizes.push_back(toU64(sizeArr.Get(i), "segment size"));
      std::shared_ptr<Device> d = device();
      return startJob<Nothing>(info, [d, fds, sizes] { d->adopt(fds, sizes); return Nothing{}; }, undefinedResult);
    } catch (...) {
      for (int fd : fds) ::close(fd);
      throw;
    }
  }

  // checkAdopted() -> Promise<void> (Device::checkAdopted): on a libuv thread, since it may make
  // the CUDA context.
  Napi::Value CheckAdopted(const Napi::CallbackInfo& info) {
    std::shared_ptr<Device> d = device();
    return startJob<Nothing>(info, [d] { d->checkAdopted(); return Nothing{}; }, undefinedResult);
  }

  // read(segment, offset, dst: Uint8Array) -> Promise<void>; dst stays pinned until it settles.
  Napi::Value Read(const Napi::CallbackInfo& info) {
    uint32_t segment = toBounded<uint32_t>(info[0], "segment");
    uint64_t offset = toU64(info[1], "offset");
    Napi::Uint8Array dst = toDestination(info[2]);
    std::shared_ptr<Device> d = device();
    uint8_t* data = dst.Data();
    size_t length = dst.ByteLength();
    return startJob<Nothing>(info, [d, segment, offset, length, data] { d->read(segment, offset, length, data); return Nothing{}; },
                             undefinedResult, {dst});
  }

  // free() -> Promise<void>: cancels a running fill and waits for its thread, then frees the
  // memory, both on the job's thread.
  // The fill is stopped explicitly, not by dropping the last reference to it: a reference left
  // anywhere else (this frame's, while the job already runs) would let free() unmap memory that
  // its thread still writes. stopping_ lets a teardown meanwhile stop it too, before it frees.
  Napi::Value Free(const Napi::CallbackInfo& info) {
    checkIdle();  // before the fill is moved out: a refused free leaves it in place
    if (job_) {
      job_->cancel();
      stopping_ = std::move(job_);
    }
    std::shared_ptr<FillJob> fill = stopping_;
    std::shared_ptr<Device> d = device_;
    return startJob<Nothing>(info, [d, fill] {
      if (fill) fill->stop();
      d->free();
      return Nothing{};
    }, undefinedResult);
  }

  // One job at a time per device, and no synchronous call while one runs: calls on a device are
  // ordered by the caller (DeviceHandle chains them), so a free() never meets a read still
  // copying, and a call that would is refused here, on the JS thread, rather than raced.
  void checkIdle() const {
    if (*busy_) {
      throw DeviceError("E_DEVICE_BUSY", "an allocate, read or free is still running on this device; await it before the next call");
    }
  }

  template <typename Result>
  Napi::Promise startJob(const Napi::CallbackInfo& info, typename PromiseJob<Result>::Run run, typename PromiseJob<Result>::Done done,
                         std::vector<Napi::Object> pins = {}) {
    checkIdle();
    pins.push_back(info.This().As<Napi::Object>());
    std::shared_ptr<bool> busy = busy_;
    Napi::Promise promise = PromiseJob<Result>::start(info.Env(), std::move(run), std::move(done), std::move(pins), [busy] { *busy = false; });
    *busy = true;  // after a start that could throw; the job settles on a later turn of the loop
    return promise;
  }

  // The device, for a call that needs it idle: no job in flight, no fill running.
  const std::shared_ptr<Device>& device() {
    checkIdle();
    if (!device_) throw DeviceError("E_CLOSED", "device is closed");
    if (job_ && !job_->status().done) {
      throw DeviceError("E_FILL_RUNNING", "the device is filling; wait for the fill or cancel it first");
    }
    return device_;
  }

  std::shared_ptr<Device> device_;
  std::unique_ptr<FillJob> job_;
  // A fill that a free() on a libuv thread is stopping (Free).
  std::shared_ptr<FillJob> stopping_;
  std::shared_ptr<Registry> registry_;
  // Read and written on the JS thread only; shared with the job, which clears it when it settles.
  std::shared_ptr<bool> busy_ = std::make_shared<bool>(false);
};

Napi::Object residencyToJs(Napi::Env env, const Residency& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("residentBytes", static_cast<double>(r.residentBytes));
  o.Set("sampledBytes", static_cast<double>(r.sampledBytes));
  o.Set("totalBytes", static_cast<double>(r.totalBytes));
  return o;
}

Napi::Object probeToJs(Napi::Env env, const CudaProbe& p) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("available", p.available);
  o.Set("reason", p.reason);
  if (p.driverVersion) o.Set("driverVersion", p.driverVersion);
  Napi::Array devices = Napi::Array::New(env, p.devices.size());
  for (uint32_t i = 0; i < p.devices.size(); ++i) {
    Napi::Object d = infoToJs(env, p.devices[i]);
    if (!p.fdHandlesUnsupported[i].empty()) d.Set("fdHandlesUnsupported", p.fdHandlesUnsupported[i]);
    devices.Set(i, d);
  }
  o.Set("devices", devices);
  return o;
}

class WeightdAddon : public Napi::Addon<WeightdAddon> {
 public:
  WeightdAddon(Napi::Env env, Napi::Object exports) : registry_(std::make_shared<Registry>()) {
    // The process's releaser thread starts with the addon, not within the first call that hands
    // it something: a call adds no thread (deferred_release.h).
    startReleaser();
    deviceCtor_ = Napi::Persistent(DeviceWrap::Define(env));
    DefineAddon(exports, {
                             InstanceValue("Device", deviceCtor_.Value()),
                             InstanceMethod<&WeightdAddon::SetErrorFactory>("setErrorFactory"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::PeerCredentials>>("peerCredentials"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::UnreadBytes>>("unreadBytes"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::FdSendStart>>("fdSendStart"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::FdSendSome>>("fdSendSome"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::FdSendEnd>>("fdSendEnd"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::UnixRequest>>("unixRequest"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CloseFd>>("closeFd"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CloseFdsAsync>>("closeFdsAsync"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::OpenReadOnly>>("openReadOnly"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::DupFd>>("dupFd"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::LeaveFillGroup>>("leaveFillGroup"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CreateWritableCopy>>("createWritableCopy"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CreateWritableSegment>>("createWritableSegment"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::SealWritten>>("sealWritten"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaStagingCopy>>("cudaStagingCopy"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaStagingFresh>>("cudaStagingFresh"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaCommitCopies>>("cudaCommitCopies"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaPullCommit>>("cudaPullCommit"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaPullCopies>>("cudaPullCopies"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaOpenPullPlan>>("cudaOpenPullPlan"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaRunPullPlan>>("cudaRunPullPlan"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaClosePullPlan>>("cudaClosePullPlan"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaPrepareFinals>>("cudaPrepareFinals"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaDropPrepared>>("cudaDropPrepared"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaDigestSegments>>("cudaDigestSegments"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::MapShared>>("mapShared"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::UnmapShared>>("unmapShared"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaProbeJs>>("cudaProbe"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::WarmCuda>>("warmCuda"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::EndCudaWarmup>>("endCudaWarmup"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::PageCacheResidency>>("pageCacheResidency"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::DigestFiles>>("digestFiles"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::SampleDigest>>("sampleDigest"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaOpenIpc>>("cudaOpenIpc"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaOpenFd>>("cudaOpenFd"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaCloseIpc>>("cudaCloseIpc"),
                             InstanceMethod<&WeightdAddon::Guarded<&WeightdAddon::CudaReadDevice>>("cudaReadDevice"),
                         });
  }

  // Environment teardown (a worker thread ending, even by terminate()): stop every fill and free
  // every device this instance created, before the thread's memory goes away.
  ~WeightdAddon() {
    {
      std::lock_guard<std::mutex> lock(registry_->mutex);
      for (DeviceWrap* d : registry_->live) d->shutdown();
    }
    settleReleases();
  }

  std::shared_ptr<Registry> registry() { return registry_; }

  Napi::Error error(Napi::Env env, const Failure& failure, Napi::Value callSite) {
    if (errorFactory_.IsEmpty()) {
      // Only before src/native/addon.ts has registered its factory (it does so on load).
      Napi::Error err = Napi::Error::New(env, failure.message);
      err.Set("code", Napi::String::New(env, failure.code));
      return err;
    }
    Napi::Value callSiteArg = callSite.IsEmpty() ? env.Undefined() : callSite;
    return Napi::Error(env, errorFactory_.Call({Napi::String::New(env, failure.code), Napi::String::New(env, failure.message), callSiteArg}));
  }

 private:
  template <Napi::Value (WeightdAddon::*Method)(const Napi::CallbackInfo&)>
  Napi::Value Guarded(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&] { return (this->*Method)(info); });
  }

  // setErrorFactory((code, message, callSite?) => Error): see makeError.
  Napi::Value SetErrorFactory(const Napi::CallbackInfo& info) {
    if (!info[0].IsFunction()) throw Napi::TypeError::New(info.Env(), "setErrorFactory(factory: function)");
    errorFactory_ = Napi::Persistent(info[0].As<Napi::Function>());
    return info.Env().Undefined();
  }

  // Reads the socket option on the JS thread: getsockopt does not block.
  Napi::Value PeerCredentials(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Credentials c = peerCredentials(toBounded<int>(info[0], "fd"));
    Napi::Object o = Napi::Object::New(env);
    o.Set("pid", c.pid);
    o.Set("uid", c.uid);
    o.Set("gid", c.gid);
    return o;
  }

  // An ioctl that does not block, as getsockopt above.
  Napi::Value UnreadBytes(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(unreadBytes(toBounded<int>(info[0], "fd"))));
  }

  // Descriptor passing (native/unix_fds.h). The frame is copied at the call: the job then owns
  // every byte it sends, whatever the caller does with its Buffer meanwhile.
  static std::vector<uint8_t> toFrame(const Napi::Value& v) {
    if (!v.IsBuffer()) throw Napi::TypeError::New(v.Env(), "frame must be a Buffer");
    Napi::Buffer<uint8_t> b = v.As<Napi::Buffer<uint8_t>>();
    return std::vector<uint8_t>(b.Data(), b.Data() + b.Length());
  }

  // A send that met a full socket (FdSendStart): what is left, and the duplicate it goes on.
  struct PendingFdSend {
    PendingFdSend(FdSend s, int caller) : send(std::move(s)), sock(caller) {}
    PendingFdSend(const PendingFdSend&) = delete;
    PendingFdSend& operator=(const PendingFdSend&) = delete;
    ~PendingFdSend() { end(); }
    // Closes the duplicate: the send is over, sent or failed.
    void end() {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
    FdSend send;
    int fd = -1;  // the duplicate, -1 until made and once closed
    int sock;     // the caller's number, for messages
  };

  static PendingFdSend* toPendingFdSend(const Napi::Value& v) {
    if (!v.IsExternal()) throw Napi::TypeError::New(v.Env(), "pending must be what fdSendStart returned");
    return v.As<Napi::External<PendingFdSend>>().Data();
  }

  static std::vector<int> toFds(const Napi::Value& v) {
    if (!v.IsArray()) throw Napi::TypeError::New(v.Env(), "fds must be an array of descriptors");
    Napi::Array arr = v.As<Napi::Array>();
    std::vector<int> fds;
    for (uint32_t i = 0; i < arr.Length(); ++i) fds.push_back(toBounded<int>(arr.Get(i), "fd"));
    return fds;
  }

  // One descriptor or -1 (none) per segment: the finals a pull made early.
  static std::vector<int> toFinals(const Napi::Value& v) {
    if (!v.IsArray()) throw Napi::TypeError::New(v.Env(), "finals must be an array of descriptors, -1 where none");
    Napi::Array arr = v.As<Napi::Array>();
    std::vector<int> fds;
    for (uint32_t i = 0; i < arr.Length(); ++i) {
      Napi::Value e = arr.Get(i);
      fds.push_back(e.IsNumber() && e.As<Napi::Number>().DoubleValue() == -1 ? -1 : toBounded<int>(e, "final fd"));
    }
    return fds;
  }

  static Napi::Value replyToJs(Napi::Env env, const UnixReply& r) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("frame", Napi::Buffer<uint8_t>::Copy(env, r.frame.data(), r.frame.size()));
    Napi::Array fds = Napi::Array::New(env, r.fds.size());
    for (uint32_t i = 0; i < r.fds.size(); ++i) fds.Set(i, r.fds[i]);
    o.Set("fds", fds);
    return o;
  }

  // A reply with descriptors, sent as far as its socket takes at once, never waiting here (see
  // src/wire/socketFdWriter.ts, which waits on the event loop between tries). A peer that stops
  // reading would otherwise hold a libuv thread for the reply's whole deadline, and four such
  // peers every allocation, free, seal and keeper request of the daemon.
  // fdSendStart(socketFd, frame, fds) -> null once all of it went, else { pending, left }: the
  // pending send, which owns a duplicate of the socket (never a number the connection may close
  // and reuse), and the bytes it has left.
  Napi::Value FdSendStart(const Napi::CallbackInfo& info) {
    int sock = toBounded<int>(info[0], "socketFd");
    auto pending = std::make_unique<PendingFdSend>(FdSend(toFrame(info[1]), toFds(info[2])), sock);
    if (pending->send.sendSome(sock)) return info.Env().Null();
    // A failure here leaves part of the frame on the wire: the connection is then destroyed.
    pending->fd = dupFd(sock);
    double left = static_cast<double>(pending->send.bytesLeft());
    Napi::External<PendingFdSend> handle = Napi::External<PendingFdSend>::New(info.Env(), pending.get(), [](Napi::Env, PendingFdSend* p) { delete p; });
    pending.release();  // the External owns it from here
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("pending", handle);
    out.Set("left", left);
    return out;
  }

  // fdSendSome(pending, deadlinePassed, timeoutMs) -> the bytes still to send: 0 once all of it
  // went (its duplicate is then closed); E_FD_TIMEOUT when the deadline has passed with bytes
  // left, E_FD_SEND on an error.
  Napi::Value FdSendSome(const Napi::CallbackInfo& info) {
    PendingFdSend* p = toPendingFdSend(info[0]);
    if (p->fd < 0) throw DeviceError("E_FD_SEND", "this send has ended already");
    bool done;
    try {
      done = p->send.sendSome(p->fd);
      if (!done && info[1].ToBoolean()) throw timeoutError(p->send.what(p->sock), toBounded<int64_t>(info[2], "timeoutMs"));
    } catch (...) {
      p->end();
      throw;
    }
    if (done) p->end();
    return Napi::Number::New(info.Env(), static_cast<double>(p->send.bytesLeft()));
  }

  // fdSendEnd(pending): gives up a pending send, closing its duplicate at once (the connection
  // closes now, not when the garbage collector takes the handle). Once ended, a no-op.
  Napi::Value FdSendEnd(const Napi::CallbackInfo& info) {
    toPendingFdSend(info[0])->end();
    return info.Env().Undefined();
  }

  // unixRequest(path, frame, fds, timeoutMs, maxReplyBytes) -> Promise<{ frame, fds }>
  Napi::Value UnixRequest(const Napi::CallbackInfo& info) {
    std::string path = toStr(info[0], "path");
    std::vector<uint8_t> frame = toFrame(info[1]);
    std::vector<int> fds = toFds(info[2]);
    int64_t timeoutMs = toBounded<int64_t>(info[3], "timeoutMs");
    uint64_t maxReplyBytes = toU64(info[4], "maxReplyBytes");
    return PromiseJob<UnixReply>::start(info.Env(), [path, frame, fds, timeoutMs, maxReplyBytes] {
      return unixRequest(path, frame, fds, timeoutMs, maxReplyBytes);
    }, replyToJs);
  }

  // openReadOnly(path) -> fd, the caller's to close (closeFd, or a device that adopts it).
  Napi::Value OpenReadOnly(const Napi::CallbackInfo& info) {
    if (!info[0].IsString()) throw Napi::TypeError::New(info.Env(), "openReadOnly(path: string)");
    return Napi::Number::New(info.Env(), openReadOnly(info[0].As<Napi::String>().Utf8Value()));
  }

  // dupFd(fd) -> fd, the caller's to close.
  Napi::Value DupFd(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), dupFd(toBounded<int>(info[0], "fd"))); }

  // leaveFillGroup(backend, id, size): one rank of a node's fill group will not fill (it adopted
  // its shard): cuda_fill_group.h, host_digest_group.h.
  Napi::Value LeaveFillGroup(const Napi::CallbackInfo& info) {
    if (!info[0].IsString() || !info[1].IsString()) throw Napi::TypeError::New(info.Env(), "leaveFillGroup(backend: 'cuda' | 'host', id: string, size: number)");
    std::string backend = info[0].As<Napi::String>().Utf8Value();
    std::string id = info[1].As<Napi::String>().Utf8Value();
    unsigned size = toBounded<unsigned>(info[2], "size");
    if (backend == "cuda") {
      leaveFillGroup(id, size);
    } else if (backend == "host") {
      leaveDigestGroup(id, size);
    } else {
      throw Napi::TypeError::New(info.Env(), "leaveFillGroup: backend must be 'cuda' or 'host', got '" + backend + "'");
    }
    return info.Env().Undefined();
  }

  Napi::Value CloseFd(const Napi::CallbackInfo& info) {
    closeFd(toBounded<int>(info[0], "fd"));
    return info.Env().Undefined();
  }

  // closeFdsAsync(fds) -> Promise<undefined>: closes them on a libuv thread, each one even when an
  // earlier one fails (the first failure, E_FD_CLOSE, is the rejection). Closing the last
  // descriptor of an exported CUDA allocation frees its GPU memory inside close(), which the main
  // thread would otherwise wait for before its next reply.
  Napi::Value CloseFdsAsync(const Napi::CallbackInfo& info) {
    std::vector<int> fds = toFds(info[0]);
    return PromiseJob<Nothing>::start(
        info.Env(),
        [fds] {
          std::optional<DeviceError> first;
          for (int fd : fds) {
            try {
              closeFd(fd);
            } catch (const DeviceError& e) {
              if (!first) first = e;
            }
          }
          if (first) throw *first;
          return Nothing{};
        },
        undefinedResult);
  }

  // createWritableCopy(sourceFd, bytes, name) -> Promise<number>: the copy runs on a libuv thread.
  Napi::Value CreateWritableCopy(const Napi::CallbackInfo& info) {
    int sourceFd = toBounded<int>(info[0], "sourceFd");
    uint64_t bytes = toU64(info[1], "bytes");
    std::string name = toStr(info[2], "name");
    return PromiseJob<int>::start(info.Env(), [sourceFd, bytes, name] { return createWritableCopy(sourceFd, bytes, name); },
                                  [](Napi::Env e, const int& fd) { return Napi::Number::New(e, fd); });
  }

  // createWritableSegment(bytes, name) -> Promise<number>: reserving the pages runs on a libuv thread.
  Napi::Value CreateWritableSegment(const Napi::CallbackInfo& info) {
    uint64_t bytes = toU64(info[0], "bytes");
    std::string name = toStr(info[1], "name");
    return PromiseJob<int>::start(info.Env(), [bytes, name] { return createWritableSegment(bytes, name); },
                                  [](Napi::Env e, const int& fd) { return Napi::Number::New(e, fd); });
  }

  // sealWritten(fd, segment, command) -> Promise<void>, on a libuv thread: the seal may wait for
  // pages held a moment (addSealsWaitingForPins, up to seconds), which must not stop every socket.
  Napi::Value SealWritten(const Napi::CallbackInfo& info) {
    if (!info[2].IsString()) throw Napi::TypeError::New(info.Env(), "sealWritten(fd: number, segment: number, command: string)");
    int fd = toBounded<int>(info[0], "fd");
    uint32_t segment = toBounded<uint32_t>(info[1], "segment");
    std::string command = info[2].As<Napi::String>().Utf8Value();
    return PromiseJob<int>::start(info.Env(), [fd, segment, command] { sealWritten(fd, segment, command); return 0; },
                                  [](Napi::Env e, const int&) { return e.Undefined(); });
  }

  // cudaStagingCopy(deviceIndex, sourceFd, bytes) -> Promise<number>: allocation and copy on a libuv thread.
  Napi::Value CudaStagingCopy(const Napi::CallbackInfo& info) {
    int deviceIndex = toBounded<int>(info[0], "deviceIndex");
    int sourceFd = toBounded<int>(info[1], "sourceFd");
    uint64_t bytes = toU64(info[2], "bytes");
    return PromiseJob<int>::start(info.Env(), [deviceIndex, sourceFd, bytes] { return cudaStagingCopy(deviceIndex, sourceFd, bytes); },
                                  [](Napi::Env e, const int& fd) { return Napi::Number::New(e, fd); });
  }

  // cudaStagingFresh(deviceIndex, bytes) -> Promise<number>, on a libuv thread.
  Napi::Value CudaStagingFresh(const Napi::CallbackInfo& info) {
    int deviceIndex = toBounded<int>(info[0], "deviceIndex");
    uint64_t bytes = toU64(info[1], "bytes");
    return PromiseJob<int>::start(info.Env(), [deviceIndex, bytes] { return cudaStagingFresh(deviceIndex, bytes); },
                                  [](Napi::Env e, const int& fd) { return Napi::Number::New(e, fd); });
  }

  static Napi::Value committedToJs(Napi::Env e, const CudaCommitted& c) {
    Napi::Object o = Napi::Object::New(e);
    Napi::Array outFds = Napi::Array::New(e, c.fds.size());
    for (uint32_t i = 0; i < c.fds.size(); ++i) outFds.Set(i, c.fds[i]);
    o.Set("fds", outFds);
    setDigested(e, o, c.digested);
    Napi::Object timings = Napi::Object::New(e);
    timings.Set("allocateMs", c.allocateMs);
    timings.Set("openMs", c.openMs);
    timings.Set("mapMs", c.mapMs);
    timings.Set("copyMs", c.copyMs);
    timings.Set("digestMs", c.digestMs);
    timings.Set("nativeMs", c.totalMs);
    timings.Set("mapped", c.mapped);
    o.Set("timings", timings);
    return o;
  }

  static std::vector<std::string> sourcesFromJs(Napi::Env env, const Napi::Value& v, const char* usage) {
    if (!v.IsArray()) throw Napi::TypeError::New(env, usage);
    Napi::Array arr = v.As<Napi::Array>();
    std::vector<std::string> sources;
    for (uint32_t i = 0; i < arr.Length(); ++i) {
      Napi::Value e = arr.Get(i);
      if (!e.IsBuffer()) throw Napi::TypeError::New(env, usage);
      Napi::Buffer<char> b = e.As<Napi::Buffer<char>>();
      sources.emplace_back(b.Data(), b.Length());
    }
    return sources;
  }

  // One flag per segment (a JS boolean[]), or the TypeError of `usage`.
  static std::vector<bool> segmentFlagsFromJs(Napi::Env env, Napi::Value v, const std::string& usage) {
    if (!v.IsArray()) throw Napi::TypeError::New(env, usage);
    Napi::Array arr = v.As<Napi::Array>();
    std::vector<bool> flags;
    for (uint32_t i = 0; i < arr.Length(); ++i) flags.push_back(arr.Get(i).ToBoolean().Value());
    return flags;
  }

  // Each segment's size in bytes (a JS number[]), or the TypeError of `usage`.
  static std::vector<uint64_t> segmentBytesFromJs(Napi::Env env, Napi::Value v, const std::string& usage) {
    if (!v.IsArray()) throw Napi::TypeError::New(env, usage);
    Napi::Array arr = v.As<Napi::Array>();
    std::vector<uint64_t> bytes;
    for (uint32_t i = 0; i < arr.Length(); ++i) bytes.push_back(toU64(arr.Get(i), "segment bytes"));
    return bytes;
  }

  // cudaPullCopies(deviceIndex, finals, writes: boolean[], bytes: number[], sources: Buffer[], commitCopies, zeroRanges, tensorRanges, threads, digestOn, prepared?)
  //   -> Promise<{ fds: number[], digests: string[], hashedOn, gpuDigestUnavailable,
  //                timings: { allocateMs, openMs, mapMs, copyMs, digestMs, nativeMs } }>, on a libuv thread.
  Napi::Value CudaPullCopies(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const char* usage = "cudaPullCopies(deviceIndex, finals, writes: boolean[], bytes: number[], sources: Buffer[], commitCopies, zeroRanges, tensorRanges, threads, digestOn, prepared?)";
    int deviceIndex = toBounded<int>(info[0], "deviceIndex");
    std::vector<int> finals = toFinals(info[1]);
    std::vector<bool> writes = segmentFlagsFromJs(env, info[2], usage);
    std::vector<uint64_t> bytes = segmentBytesFromJs(env, info[3], usage);
    std::vector<std::string> sources = sourcesFromJs(env, info[4], usage);
    std::vector<CommitCopy> copies = commitCopiesFromJs(info[5]);
    std::vector<ZeroRange> zeros = zeroRangesFromJs(info[6]);
    std::vector<TensorRange> tensors = tensorRangesFromJs(info[7]);
    unsigned threads = toBounded<unsigned>(info[8], "threads");
    if (threads < 1 || threads > 256) throw Napi::RangeError::New(env, "threads must be from 1 to 256, got " + std::to_string(threads));
    bool onGpu = digestOnGpuFromJs(info[9]);
    uint32_t prepared = info[10].IsUndefined() ? 0 : toBounded<uint32_t>(info[10], "prepared");
    return PromiseJob<CudaPulled>::start(
        env,
        [deviceIndex, finals, writes, bytes, sources, copies, zeros, tensors, threads, onGpu, prepared] {
          return cudaPullCopies(deviceIndex, finals, writes, bytes, sources, copies, zeros, tensors, threads, onGpu, prepared);
        },
        pulledToJs);
  }

  static Napi::Value pulledToJs(Napi::Env e, const CudaPulled& p) {
    Napi::Object o = Napi::Object::New(e);
    Napi::Array fds = Napi::Array::New(e, p.fds.size());
    for (uint32_t i = 0; i < p.fds.size(); ++i) fds.Set(i, p.fds[i]);
    o.Set("fds", fds);
    setDigested(e, o, p.digested);
    Napi::Object timings = Napi::Object::New(e);
    timings.Set("allocateMs", p.allocateMs);
    timings.Set("openMs", p.openMs);
    timings.Set("mapMs", p.mapMs);
    timings.Set("copyMs", p.copyMs);
    timings.Set("digestMs", p.digestMs);
    timings.Set("releaseMs", p.releaseMs);
    timings.Set("nativeMs", p.totalMs);
    timings.Set("setupMs", p.setupMs);
    timings.Set("moduleMs", p.moduleMs);
    timings.Set("copiedByKernelBytes", static_cast<double>(p.copiedByKernelBytes));
    o.Set("timings", timings);
    return o;
  }

  // cudaOpenPullPlan(deviceIndex, writes: boolean[], bytes: number[], sources: Buffer[], commitCopies, zeroRanges, tensorRanges, digestOn)
  //   -> Promise<{ id, gpuDigestUnavailable, timings: { openMs, setupMs, moduleMs, nativeMs, copiedByKernelBytes } }>, on a libuv thread.
  Napi::Value CudaOpenPullPlan(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const char* usage = "cudaOpenPullPlan(deviceIndex, writes: boolean[], bytes: number[], sources: Buffer[], commitCopies, zeroRanges, tensorRanges, digestOn)";
    int deviceIndex = toBounded<int>(info[0], "deviceIndex");
    std::vector<bool> writes = segmentFlagsFromJs(env, info[1], usage);
    std::vector<uint64_t> bytes = segmentBytesFromJs(env, info[2], usage);
    std::vector<std::string> sources = sourcesFromJs(env, info[3], usage);
    std::vector<CommitCopy> copies = commitCopiesFromJs(info[4]);
    std::vector<ZeroRange> zeros = zeroRangesFromJs(info[5]);
    std::vector<TensorRange> tensors = tensorRangesFromJs(info[6]);
    bool onGpu = digestOnGpuFromJs(info[7]);
    return PromiseJob<PullPlanMade>::start(
        env, [deviceIndex, writes, bytes, sources, copies, zeros, tensors, onGpu] { return cudaOpenPullPlan(deviceIndex, writes, bytes, sources, copies, zeros, tensors, onGpu); },
        [](Napi::Env e, const PullPlanMade& p) {
          Napi::Object o = Napi::Object::New(e);
          o.Set("id", p.id);
          o.Set("gpuDigestUnavailable", p.gpuDigestUnavailable);
          Napi::Object timings = Napi::Object::New(e);
          timings.Set("openMs", p.openMs);
          timings.Set("setupMs", p.setupMs);
          timings.Set("moduleMs", p.moduleMs);
          timings.Set("nativeMs", p.totalMs);
          timings.Set("copiedByKernelBytes", static_cast<double>(p.copiedByKernelBytes));
          o.Set("timings", timings);
          return o;
        });
  }

  // cudaRunPullPlan(id, finals, threads, prepared?) -> Promise<as cudaPullCopies'>, on a libuv thread.
  Napi::Value CudaRunPullPlan(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t id = toBounded<uint32_t>(info[0], "id");
    std::vector<int> finals = toFinals(info[1]);
    unsigned threads = toBounded<unsigned>(info[2], "threads");
    if (threads < 1 || threads > 256) throw Napi::RangeError::New(env, "threads must be from 1 to 256, got " + std::to_string(threads));
    uint32_t prepared = info[3].IsUndefined() ? 0 : toBounded<uint32_t>(info[3], "prepared");
    return PromiseJob<CudaPulled>::start(env, [id, finals, threads, prepared] { return cudaRunPullPlan(id, finals, threads, prepared); }, pulledToJs);
  }

  // cudaClosePullPlan(id) -> Promise<void>: hands the plan's resources to the releaser, on a libuv thread.
  Napi::Value CudaClosePullPlan(const Napi::CallbackInfo& info) {
    uint32_t id = toBounded<uint32_t>(info[0], "id");
    return PromiseJob<int>::start(info.Env(), [id] { cudaClosePullPlan(id); return 0; }, [](Napi::Env e, const int&) { return e.Undefined(); });
  }

  // cudaCommitCopies(deviceIndex, fds, copied: boolean[], bytes: number[], tensorRanges, threads, digestOn)
  //   -> Promise<{ fds: number[], digests: string[], hashedOn, gpuDigestUnavailable }>, on a libuv thread.
  Napi::Value CudaCommitCopies(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const char* usage = "cudaCommitCopies(deviceIndex, fds, copied: boolean[], bytes: number[], tensorRanges, threads, digestOn)";
    int deviceIndex = toBounded<int>(info[0], "deviceIndex");
    std::vector<int> fds = toFds(info[1]);
    std::vector<bool> copied = segmentFlagsFromJs(env, info[2], usage);
    std::vector<uint64_t> bytes = segmentBytesFromJs(env, info[3], usage);
    std::vector<TensorRange> tensors = tensorRangesFromJs(info[4]);
    unsigned threads = toBounded<unsigned>(info[5], "threads");
    if (threads < 1 || threads > 256) throw Napi::RangeError::New(env, "threads must be from 1 to 256, got " + std::to_string(threads));
    bool onGpu = digestOnGpuFromJs(info[6]);
    return PromiseJob<CudaCommitted>::start(
        env, [deviceIndex, fds, copied, bytes, tensors, threads, onGpu] { return cudaCommitCopies(deviceIndex, fds, copied, bytes, tensors, threads, onGpu); },
        committedToJs);
  }

  // cudaPullCommit(deviceIndex, fds, copied: boolean[], bytes: number[], finals, sources: Buffer[], commitCopies, tensorRanges, threads, digestOn, prepared?)
  //   -> Promise<{ fds: number[], digests: string[], hashedOn, gpuDigestUnavailable, timings }>, on a libuv thread.
  Napi::Value CudaPullCommit(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const char* usage = "cudaPullCommit(deviceIndex, fds, copied: boolean[], bytes: number[], finals, sources: Buffer[], commitCopies, tensorRanges, threads, digestOn)";
    int deviceIndex = toBounded<int>(info[0], "deviceIndex");
    std::vector<int> fds = toFds(info[1]);
    std::vector<bool> copied = segmentFlagsFromJs(env, info[2], usage);
    std::vector<uint64_t> bytes = segmentBytesFromJs(env, info[3], usage);
    std::vector<int> finals = toFinals(info[4]);
    std::vector<std::string> sources = sourcesFromJs(env, info[5], usage);
    std::vector<CommitCopy> copies = commitCopiesFromJs(info[6]);
    std::vector<TensorRange> tensors = tensorRangesFromJs(info[7]);
    unsigned threads = toBounded<unsigned>(info[8], "threads");
    if (threads < 1 || threads > 256) throw Napi::RangeError::New(env, "threads must be from 1 to 256, got " + std::to_string(threads));
    bool onGpu = digestOnGpuFromJs(info[9]);
    uint32_t prepared = info[10].IsUndefined() ? 0 : toBounded<uint32_t>(info[10], "prepared");
    return PromiseJob<CudaCommitted>::start(
        env,
        [deviceIndex, fds, copied, bytes, finals, sources, copies, tensors, threads, onGpu, prepared] {
          return cudaPullCommit(deviceIndex, fds, copied, bytes, finals, sources, copies, tensors, threads, onGpu, prepared);
        },
        committedToJs);
  }

  // cudaPrepareFinals(deviceIndex, which: boolean[], bytes: number[])
  //   -> Promise<{ id: number, fds: number[], timings: { allocateMs, nativeMs } }>, on a libuv thread.
  Napi::Value CudaPrepareFinals(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const char* usage = "cudaPrepareFinals(deviceIndex, which: boolean[], bytes: number[])";
    int deviceIndex = toBounded<int>(info[0], "deviceIndex");
    std::vector<bool> which = segmentFlagsFromJs(env, info[1], usage);
    std::vector<uint64_t> bytes = segmentBytesFromJs(env, info[2], usage);
    return PromiseJob<PreparedMade>::start(
        env, [deviceIndex, which, bytes] { return cudaPrepareFinals(deviceIndex, which, bytes); },
        [](Napi::Env e, const PreparedMade& p) {
          Napi::Object o = Napi::Object::New(e);
          o.Set("id", p.id);
          Napi::Array fds = Napi::Array::New(e, p.fds.size());
          for (uint32_t i = 0; i < p.fds.size(); ++i) fds.Set(i, p.fds[i]);
          o.Set("fds", fds);
          Napi::Object timings = Napi::Object::New(e);
          timings.Set("allocateMs", p.allocateMs);
          timings.Set("nativeMs", p.totalMs);
          o.Set("timings", timings);
          return o;
        });
  }

  // cudaDropPrepared(id) -> Promise<void>: unmaps a prepared set on a libuv thread.
  Napi::Value CudaDropPrepared(const Napi::CallbackInfo& info) {
    uint32_t id = toBounded<uint32_t>(info[0], "id");
    return PromiseJob<int>::start(info.Env(), [id] { cudaDropPrepared(id); return 0; }, [](Napi::Env e, const int&) { return e.Undefined(); });
  }

  // cudaDigestSegments(deviceIndex, fds, bytes: number[], tensorRanges, threads, digestOn)
  //   -> Promise<{ digests: string[], hashedOn, gpuDigestUnavailable: string }>, on a libuv thread.
  Napi::Value CudaDigestSegments(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    int deviceIndex = toBounded<int>(info[0], "deviceIndex");
    std::vector<int> fds = toFds(info[1]);
    std::vector<uint64_t> bytes = segmentBytesFromJs(env, info[2], "cudaDigestSegments(deviceIndex, fds, bytes: number[], tensorRanges, threads, digestOn)");
    std::vector<TensorRange> tensors = tensorRangesFromJs(info[3]);
    unsigned threads = toBounded<unsigned>(info[4], "threads");
    if (threads < 1 || threads > 256) throw Napi::RangeError::New(env, "threads must be from 1 to 256, got " + std::to_string(threads));
    bool onGpu = digestOnGpuFromJs(info[5]);
    return PromiseJob<CudaDigests>::start(
        env, [deviceIndex, fds, bytes, tensors, threads, onGpu] { return cudaDigestSegments(deviceIndex, fds, bytes, tensors, threads, onGpu); },
        [](Napi::Env e, const CudaDigests& d) {
          Napi::Object o = Napi::Object::New(e);
          setDigested(e, o, d);
          return o;
        });
  }

  // The digests, where they were hashed and why not on the GPU, on a result object.
  static void setDigested(Napi::Env env, Napi::Object o, const CudaDigests& d) {
    Napi::Array digests = Napi::Array::New(env, d.digests.size());
    for (uint32_t i = 0; i < d.digests.size(); ++i) digests.Set(i, d.digests[i]);
    o.Set("digests", digests);
    o.Set("hashedOn", d.onGpu ? "gpu" : "cpu");
    o.Set("gpuDigestUnavailable", d.gpuDigestUnavailable);
  }

  // mapShared(fd, bytes) and unmapShared run on the JS thread: mmap of a memfd maps, it reads nothing.
  Napi::Value MapShared(const Napi::CallbackInfo& info) {
    return mappings_.map(info.Env(), toBounded<int>(info[0], "fd"), toU64(info[1], "bytes"));
  }

  Napi::Value UnmapShared(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArrayBuffer()) throw Napi::TypeError::New(env, "unmapShared(buffer: ArrayBuffer)");
    mappings_.unmap(info[0].As<Napi::ArrayBuffer>());
    return env.Undefined();
  }

  // pageCacheResidency(paths: string[]) -> Promise<{ residentBytes, sampledBytes, totalBytes }>
  Napi::Value PageCacheResidency(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "pageCacheResidency(paths: string[])");
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<std::string> paths;
    for (uint32_t i = 0; i < arr.Length(); ++i) paths.push_back(toStr(arr.Get(i), "file path"));
    return PromiseJob<Residency>::start(env, [paths] { return pageCacheResidency(paths); }, residencyToJs);
  }

  // digestFiles(paths: string[], tensorRanges: Float64Array, threads: number) -> Promise<string[]>
  Napi::Value DigestFiles(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "digestFiles(paths: string[], tensorRanges: Float64Array, threads: number)");
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<std::string> paths;
    for (uint32_t i = 0; i < arr.Length(); ++i) paths.push_back(toStr(arr.Get(i), "file path"));
    std::vector<TensorRange> tensors = tensorRangesFromJs(info[1]);
    unsigned threads = toBounded<unsigned>(info[2], "threads");
    if (threads < 1 || threads > 256) throw Napi::RangeError::New(env, "threads must be from 1 to 256, got " + std::to_string(threads));
    return PromiseJob<std::vector<std::string>>::start(
        env, [paths, tensors, threads] { return digestFiles(paths, tensors, threads); },
        [](Napi::Env e, const std::vector<std::string>& digests) {
          Napi::Array out = Napi::Array::New(e, digests.size());
          for (uint32_t i = 0; i < digests.size(); ++i) out.Set(i, digests[i]);
          return out;
        });
  }

  // sampleDigest(fd: number, ranges: Float64Array, mergeGap: number) ->
  //   Promise<{ digest } | { endedAt } | { failedAt, reason }>: the caller names the file in its errors.
  Napi::Value SampleDigest(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    int fd = toBounded<int>(info[0], "fd");
    if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array) {
      throw Napi::TypeError::New(env, "sampleDigest(fd, ranges: Float64Array of [begin, end) pairs, mergeGap)");
    }
    Napi::Float64Array f = info[1].As<Napi::Float64Array>();
    if (f.ElementLength() % 2 != 0) throw Napi::RangeError::New(env, "ranges must hold [begin, end) pairs, got " + std::to_string(f.ElementLength()) + " numbers");
    std::vector<uint64_t> ranges(f.ElementLength());
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (!isSafeU64(f[i])) throw Napi::RangeError::New(env, "ranges[" + std::to_string(i) + "] is not a non-negative safe integer");
      ranges[i] = static_cast<uint64_t>(f[i]);
      if (i > 0 && ranges[i] < ranges[i - 1]) throw Napi::RangeError::New(env, "ranges must be ascending and disjoint: ranges[" + std::to_string(i) + "] goes back");
    }
    uint64_t mergeGap = toU64(info[2], "mergeGap");
    return PromiseJob<SampledDigest>::start(
        env, [fd, ranges, mergeGap] { return sampledDigest(fd, ranges, mergeGap); },
        [](Napi::Env e, const SampledDigest& d) {
          Napi::Object o = Napi::Object::New(e);
          if (!d.digest.empty()) o.Set("digest", d.digest);
          if (d.endedAt >= 0) o.Set("endedAt", static_cast<double>(d.endedAt));
          if (d.failedAt >= 0) {
            o.Set("failedAt", static_cast<double>(d.failedAt));
            o.Set("reason", d.reason);
          }
          return o;
        });
  }

  // warmCuda(devices, stagingBytes) -> Promise<void>, never rejected: the probe and the devices
  // that follow report what failed here.
  Napi::Value WarmCuda(const Napi::CallbackInfo& info) {
    int devices = toBounded<int>(info[0], "devices");
    uint64_t stagingBytes = info[1].IsUndefined() ? 0 : toU64(info[1], "stagingBytes");
    return PromiseJob<Nothing>::start(info.Env(), [devices, stagingBytes] {
      warmCuda(devices, stagingBytes);
      return Nothing{};
    }, undefinedResult);
  }

  Napi::Value EndCudaWarmup(const Napi::CallbackInfo& info) {
    endWarmContexts();
    return info.Env().Undefined();
  }

  // cudaProbe() -> Promise<{ available, reason, driverVersion?, devices }>: runs cuInit, which
  // takes a fifth of a second. Never rejects for a machine without a driver or GPU: that is the
  // answer, not an error.
  Napi::Value CudaProbeJs(const Napi::CallbackInfo& info) {
    return PromiseJob<CudaProbe>::start(info.Env(), [] { return probeCuda(); }, probeToJs);
  }

  static uint64_t toPointer(const Napi::Value& v) {
    if (!v.IsBigInt()) throw Napi::TypeError::New(v.Env(), "pointer must be a bigint");
    bool lossless = false;
    uint64_t p = v.As<Napi::BigInt>().Uint64Value(&lossless);
    if (!lossless) throw Napi::RangeError::New(v.Env(), "pointer must fit in 64 bits");
    return p;
  }

  // cudaOpenIpc(deviceIndex, handleBase64) -> { pointer: bigint, bytes }
  Napi::Value CudaOpenIpc(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    int index = toBounded<int>(info[0], "deviceIndex");
    OpenedIpc opened = ipc_->open(index, toStr(info[1], "handle"));
    Napi::Object o = Napi::Object::New(env);
    o.Set("pointer", Napi::BigInt::New(env, static_cast<uint64_t>(opened.pointer)));
    o.Set("bytes", static_cast<double>(opened.bytes));
    return o;
  }

  // cudaOpenFd(deviceIndex, fd, bytes) -> { pointer: bigint, bytes }: a "cuda-fd" segment, mapped
  // on the JS thread like cudaOpenIpc (import and map take a third of a millisecond for 8 GiB).
  Napi::Value CudaOpenFd(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    int index = toBounded<int>(info[0], "deviceIndex");
    OpenedIpc opened = ipc_->openFd(index, toBounded<int>(info[1], "fd"), toU64(info[2], "bytes"));
    Napi::Object o = Napi::Object::New(env);
    o.Set("pointer", Napi::BigInt::New(env, static_cast<uint64_t>(opened.pointer)));
    o.Set("bytes", static_cast<double>(opened.bytes));
    return o;
  }

  Napi::Value CudaCloseIpc(const Napi::CallbackInfo& info) {
    ipc_->close(toPointer(info[0]));
    return info.Env().Undefined();
  }

  // cudaReadDevice(deviceIndex, pointer, offset, dst: Uint8Array) -> Promise<void>: fills dst
  // from an opened mapping. The job holds the IPC client (whose lock orders it against close),
  // so the client outlives it even if this instance goes first.
  Napi::Value CudaReadDevice(const Napi::CallbackInfo& info) {
    int index = toBounded<int>(info[0], "deviceIndex");
    uint64_t pointer = toPointer(info[1]);
    uint64_t offset = toU64(info[2], "offset");
    Napi::Uint8Array dst = toDestination(info[3]);
    std::shared_ptr<CudaIpcClient> ipc = ipc_;
    uint8_t* data = dst.Data();
    size_t length = dst.ByteLength();
    return PromiseJob<Nothing>::start(info.Env(), [ipc, index, pointer, offset, length, data] {
      ipc->read(index, pointer, offset, length, data);
      return Nothing{};
    }, undefinedResult, {dst});
  }

  Napi::FunctionReference deviceCtor_;
  Napi::FunctionReference errorFactory_;
  std::shared_ptr<Registry> registry_;
  HostMappings mappings_;
  std::shared_ptr<CudaIpcClient> ipc_ = std::make_shared<CudaIpcClient>();
};

Napi::Error makeError(Napi::Env env, const Failure& failure, Napi::Value callSite) {
  return env.GetInstanceData<WeightdAddon>()->error(env, failure, callSite);
}

DeviceWrap::DeviceWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<DeviceWrap>(info) {
  Napi::Env env = info.Env();
  std::string backend = toStr(info[0], "backend");
  int index = toBounded<int>(info[1], "index");
  DeviceOptions opts;
  if (info[2].IsObject()) {
    Napi::Object o = info[2].As<Napi::Object>();
    if (o.Has("uuid")) opts.uuid = toStr(o.Get("uuid"), "uuid");
    if (o.Has("cudaHandles")) opts.cudaHandles = toStr(o.Get("cudaHandles"), "cudaHandles");
    if (o.Has("deferContext")) opts.deferContext = o.Get("deferContext").ToBoolean().Value();
  }
  device_ = guarded(env, [&] { return makeDevice(backend, index, opts); });
  registry_ = env.GetInstanceData<WeightdAddon>()->registry();
  std::lock_guard<std::mutex> lock(registry_->mutex);
  registry_->live.insert(this);
}

}  // namespace
}  // namespace weightd

using weightd::WeightdAddon;
NODE_API_ADDON(WeightdAddon)
