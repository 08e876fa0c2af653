// Node-API bindings: argument checking, conversion to plain C++ data, and errors turned into
// JS errors with a stable `code`. State lives per addon instance (every worker thread loads
// its own), never in globals.
#include <napi.h>

#include <memory>
#include <mutex>
#include <set>

#include "cuda_driver.h"
#include "cuda_warmup.h"
#include "cuda_ipc.h"
#include "device_factory.h"
#include "fill_args.h"
#include "fill_job.h"
#include "page_cache.h"
#include "host_mapping.h"
#include "peer_credentials.h"
#include "js_values.h"

namespace weightd {
namespace {

Napi::Error makeError(Napi::Env env, const std::string& code, const std::string& message) {
  Napi::Error err = Napi::Error::New(env, message);
  err.Set("code", Napi::String::New(env, code));
  err.Set("name", Napi::String::New(env, "DeviceError"));
  return err;
}

[[noreturn]] void throwDeviceError(Napi::Env env, const DeviceError& e) { throw makeError(env, e.code(), e.what()); }

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
                           InstanceMethod<&DeviceWrap::Info>("info"),
                           InstanceMethod<&DeviceWrap::Allocate>("allocate"),
                           InstanceMethod<&DeviceWrap::StartFill>("startFill"),
                           InstanceMethod<&DeviceWrap::FillStatusJs>("fillStatus"),
                           InstanceMethod<&DeviceWrap::CancelFill>("cancelFill"),
                           InstanceMethod<&DeviceWrap::ExportSegments>("exportSegments"),
                           InstanceMethod<&DeviceWrap::Read>("read"),
                           InstanceMethod<&DeviceWrap::Release>("release"),
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

  // Stops any fill (joining its thread) and frees the device's memory. Safe to call twice.
  void shutdown() {
    job_.reset();
    if (device_) device_->release();
  }

 private:
  Napi::Value Info(const Napi::CallbackInfo& info) {
    try {
      return infoToJs(info.Env(), device().info());
    } catch (const DeviceError& e) {
      throwDeviceError(info.Env(), e);
    }
  }

  Napi::Value Allocate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "allocate(segmentBytes: number[])");
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<uint64_t> sizes;
    for (uint32_t i = 0; i < arr.Length(); ++i) sizes.push_back(toU64(arr.Get(i), "segment size"));
    if (sizes.empty()) throw Napi::RangeError::New(env, "allocate needs at least one segment");
    try {
      device().allocate(sizes);
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
    return env.Undefined();
  }

  Napi::Value StartFill(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (job_ && !job_->status().done) throw makeError(env, "E_FILL_RUNNING", "a fill is already running on this device");
    FillArgs args = fillArgsFromJs(info);
    job_.reset();
    try {
      job_ = std::make_unique<FillJob>(device_, std::move(args.files), std::move(args.ops), std::move(args.zeros), args.options);
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
    return env.Undefined();
  }

  Napi::Value FillStatusJs(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!job_) throw makeError(env, "E_NO_FILL", "no fill has been started on this device");
    FillStatus s = job_->status();
    Napi::Object o = Napi::Object::New(env);
    o.Set("done", s.done);
    o.Set("bytes", static_cast<double>(s.bytes));
    o.Set("seconds", s.seconds);
    o.Set("waitingForGroup", s.waitingForGroup);
    if (s.failed) o.Set("error", makeError(env, s.errorCode, s.errorMessage).Value());
    return o;
  }

  Napi::Value CancelFill(const Napi::CallbackInfo& info) {
    if (job_) job_->cancel();
    return info.Env().Undefined();
  }

  Napi::Value ExportSegments(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    try {
      std::vector<SegmentExport> segs = device().exportSegments();
      Napi::Array arr = Napi::Array::New(env, segs.size());
      for (uint32_t i = 0; i < segs.size(); ++i) {
        Napi::Object o = Napi::Object::New(env);
        o.Set("segment", segs[i].segment);
        o.Set("bytes", static_cast<double>(segs[i].bytes));
        o.Set("handle", segs[i].handle);
        arr.Set(i, o);
      }
      return arr;
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
  }

  Napi::Value Read(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t segment = toBounded<uint32_t>(info[0], "segment");
    uint64_t offset = toU64(info[1], "offset");
    Napi::Uint8Array dst = toDestination(info[2]);
    try {
      device().read(segment, offset, dst.ByteLength(), dst.Data());
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
    return env.Undefined();
  }

  Napi::Value Release(const Napi::CallbackInfo& info) {
    try {
      shutdown();
    } catch (const DeviceError& e) {
      throwDeviceError(info.Env(), e);
    }
    return info.Env().Undefined();
  }

  Device& device() {
    if (!device_) throw DeviceError("E_CLOSED", "device is closed");
    if (job_ && !job_->status().done) {
      throw DeviceError("E_FILL_RUNNING", "the device is filling; wait for the fill or cancel it first");
    }
    return *device_;
  }

  std::shared_ptr<Device> device_;
  std::unique_ptr<FillJob> job_;
  std::shared_ptr<Registry> registry_;
};

// warmCuda (cuda_warmup.h) on a libuv thread. Never rejects: the probe that follows reports.
class CudaWarmup : public Napi::AsyncWorker {
 public:
  CudaWarmup(Napi::Env env, int devices) : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), devices_(devices) {}
  Napi::Promise promise() { return deferred_.Promise(); }
  void Execute() override { warmCuda(devices_); }
  void OnOK() override { deferred_.Resolve(Env().Undefined()); }
  void OnError(const Napi::Error&) override { deferred_.Resolve(Env().Undefined()); }

 private:
  Napi::Promise::Deferred deferred_;
  int devices_;
};

class WeightdAddon : public Napi::Addon<WeightdAddon> {
 public:
  WeightdAddon(Napi::Env env, Napi::Object exports) : registry_(std::make_shared<Registry>()) {
    deviceCtor_ = Napi::Persistent(DeviceWrap::Define(env));
    DefineAddon(exports, {
                             InstanceValue("Device", deviceCtor_.Value()),
                             InstanceMethod<&WeightdAddon::PeerCredentials>("peerCredentials"),
                             InstanceMethod<&WeightdAddon::MapShared>("mapShared"),
                             InstanceMethod<&WeightdAddon::UnmapShared>("unmapShared"),
                             InstanceMethod<&WeightdAddon::CudaProbeJs>("cudaProbe"),
                             InstanceMethod<&WeightdAddon::WarmCuda>("warmCuda"),
                             InstanceMethod<&WeightdAddon::ReleaseWarmCuda>("releaseWarmCuda"),
                             InstanceMethod<&WeightdAddon::PageCacheResidency>("pageCacheResidency"),
                             InstanceMethod<&WeightdAddon::CudaOpenIpc>("cudaOpenIpc"),
                             InstanceMethod<&WeightdAddon::CudaCloseIpc>("cudaCloseIpc"),
                             InstanceMethod<&WeightdAddon::CudaReadDevice>("cudaReadDevice"),
                         });
  }

  // Environment teardown (a worker thread ending, even by terminate()): stop every fill and free
  // every device this instance created, before the thread's memory goes away.
  ~WeightdAddon() {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    for (DeviceWrap* d : registry_->live) d->shutdown();
  }

  std::shared_ptr<Registry> registry() { return registry_; }

 private:
  Napi::Value PeerCredentials(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    int fd = toBounded<int>(info[0], "fd");
    try {
      Credentials c = peerCredentials(fd);
      Napi::Object o = Napi::Object::New(env);
      o.Set("pid", c.pid);
      o.Set("uid", c.uid);
      o.Set("gid", c.gid);
      return o;
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
  }

  Napi::Value MapShared(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    std::string path = toStr(info[0], "path");
    uint64_t bytes = toU64(info[1], "bytes");
    try {
      return mappings_.map(env, path, bytes);
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
  }

  Napi::Value UnmapShared(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArrayBuffer()) throw Napi::TypeError::New(env, "unmapShared(buffer: ArrayBuffer)");
    mappings_.unmap(info[0].As<Napi::ArrayBuffer>());
    return env.Undefined();
  }

  // pageCacheResidency(paths: string[]) -> { residentBytes, totalBytes }
  Napi::Value PageCacheResidency(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "pageCacheResidency(paths: string[])");
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<std::string> paths;
    for (uint32_t i = 0; i < arr.Length(); ++i) paths.push_back(toStr(arr.Get(i), "file path"));
    try {
      Residency r = pageCacheResidency(paths);
      Napi::Object o = Napi::Object::New(env);
      o.Set("residentBytes", static_cast<double>(r.residentBytes));
      o.Set("sampledBytes", static_cast<double>(r.sampledBytes));
      o.Set("totalBytes", static_cast<double>(r.totalBytes));
      return o;
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
  }

  // warmCuda(devices) -> Promise<void>: see CudaWarmup.
  Napi::Value WarmCuda(const Napi::CallbackInfo& info) {
    auto* worker = new CudaWarmup(info.Env(), toBounded<int>(info[0], "devices"));  // deletes itself when done
    Napi::Promise promise = worker->promise();
    worker->Queue();
    return promise;
  }

  Napi::Value ReleaseWarmCuda(const Napi::CallbackInfo& info) {
    releaseWarmContexts();
    return info.Env().Undefined();
  }

  // cudaProbe() -> { available, reason, driverVersion?, devices }. Never throws for a machine
  // without a driver or GPU: that is the answer, not an error.
  Napi::Value CudaProbeJs(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CudaProbe p = probeCuda();
    Napi::Object o = Napi::Object::New(env);
    o.Set("available", p.available);
    o.Set("reason", p.reason);
    if (p.driverVersion) o.Set("driverVersion", p.driverVersion);
    Napi::Array devices = Napi::Array::New(env, p.devices.size());
    for (uint32_t i = 0; i < p.devices.size(); ++i) devices.Set(i, infoToJs(env, p.devices[i]));
    o.Set("devices", devices);
    return o;
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
    std::string handle = toStr(info[1], "handle");
    try {
      OpenedIpc opened = ipc_.open(index, handle);
      Napi::Object o = Napi::Object::New(env);
      o.Set("pointer", Napi::BigInt::New(env, static_cast<uint64_t>(opened.pointer)));
      o.Set("bytes", static_cast<double>(opened.bytes));
      return o;
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
  }

  Napi::Value CudaCloseIpc(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint64_t pointer = toPointer(info[0]);
    try {
      ipc_.close(pointer);
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
    return env.Undefined();
  }

  // cudaReadDevice(deviceIndex, pointer, offset, dst: Uint8Array): fills dst from an opened mapping.
  Napi::Value CudaReadDevice(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    int index = toBounded<int>(info[0], "deviceIndex");
    uint64_t pointer = toPointer(info[1]);
    uint64_t offset = toU64(info[2], "offset");
    Napi::Uint8Array dst = toDestination(info[3]);
    try {
      ipc_.read(index, pointer, offset, dst.ByteLength(), dst.Data());
    } catch (const DeviceError& e) {
      throwDeviceError(env, e);
    }
    return env.Undefined();
  }

  Napi::FunctionReference deviceCtor_;
  std::shared_ptr<Registry> registry_;
  HostMappings mappings_;
  CudaIpcClient ipc_;
};

DeviceWrap::DeviceWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<DeviceWrap>(info) {
  Napi::Env env = info.Env();
  std::string backend = toStr(info[0], "backend");
  int index = toBounded<int>(info[1], "index");
  DeviceOptions opts;
  if (info[2].IsObject()) {
    Napi::Object o = info[2].As<Napi::Object>();
    if (o.Has("uuid")) opts.uuid = toStr(o.Get("uuid"), "uuid");
    if (o.Has("shmDir")) opts.shmDir = toStr(o.Get("shmDir"), "shmDir");
  }
  try {
    device_ = makeDevice(backend, index, opts);
  } catch (const DeviceError& e) {
    throwDeviceError(env, e);
  }
  registry_ = env.GetInstanceData<WeightdAddon>()->registry();
  std::lock_guard<std::mutex> lock(registry_->mutex);
  registry_->live.insert(this);
}

}  // namespace
}  // namespace weightd

using weightd::WeightdAddon;
NODE_API_ADDON(WeightdAddon)
