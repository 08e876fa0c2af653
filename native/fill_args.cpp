#include "fill_args.h"

#include <iterator>
#include <limits>

#include "js_values.h"

namespace weightd {

namespace {

// Reader threads per fill; src/nodeOptions.ts bounds --load-threads the same.
constexpr uint64_t kMaxThreads = 256;

// A Float64Array of Record<T>'s records, every field a non-negative safe integer and every
// index field at most 2^32-1 (a file index of 2^32 would quietly become file 0).
template <typename T>
std::vector<T> recordsFromJs(const Napi::Value& v, const char* what) {
  using R = Record<T>;
  constexpr size_t width = std::size(R::kFields);
  Napi::Env env = v.Env();
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_float64_array ||
      v.As<Napi::TypedArray>().ElementLength() % width != 0) {
    throw Napi::TypeError::New(env, std::string(what) + " must be a Float64Array of " + std::to_string(width) + " numbers per " + R::kName);
  }
  Napi::Float64Array f = v.As<Napi::Float64Array>();
  std::vector<T> out(f.ElementLength() / width);
  uint64_t fields[width];
  for (size_t n = 0; n < out.size(); ++n) {
    for (size_t k = 0; k < width; ++k) {
      double d = f[n * width + k];
      if (!isSafeU64(d)) {
        throw Napi::RangeError::New(env, std::string(R::kName) + " " + std::to_string(n) + " field " + std::to_string(k) + " (" +
                                             R::kFields[k] + ") is not a non-negative safe integer");
      }
      fields[k] = static_cast<uint64_t>(d);
      if (k < R::kIndexFields && fields[k] > std::numeric_limits<uint32_t>::max()) {
        throw Napi::RangeError::New(env, std::string(R::kName) + " " + std::to_string(n) + " " + R::kFields[k] + " index " +
                                             std::to_string(fields[k]) + " is past 2^32-1");
      }
    }
    out[n] = R::unpack(fields);
  }
  return out;
}

// A sizing number the policy must have decided: the bindings have no defaults of their own.
uint64_t decided(const Napi::Object& o, const char* key, uint64_t max = std::numeric_limits<uint64_t>::max()) {
  if (!o.Has(key) || o.Get(key).IsUndefined()) {
    throw Napi::TypeError::New(o.Env(), std::string("startFill options.") + key +
                                            " is missing: DeviceHandle.fill completes the options with src/native/fillPolicy.ts fillSizing");
  }
  uint64_t n = toU64(o.Get(key), key);
  if (n < 1 || n > max) {
    throw Napi::RangeError::New(o.Env(), std::string(key) + " must be from 1 to " + std::to_string(max) + ", got " + std::to_string(n));
  }
  return n;
}

FillOptions optionsFromJs(const Napi::Object& o) {
  Napi::Env env = o.Env();
  FillOptions opts;
  opts.threads = static_cast<unsigned>(decided(o, "threads", kMaxThreads));
  opts.chunkBytes = decided(o, "chunkBytes");
  opts.stagingBytes = decided(o, "stagingBytes");
  opts.maxGroupStagingBytes = decided(o, "maxGroupStagingBytes");
  if (o.Has("direct")) opts.direct = o.Get("direct").ToBoolean();
  if (o.Has("mode")) {
    std::string mode = toStr(o.Get("mode"), "mode");
    if (mode == "pread") opts.mode = FillMode::Pread;
    else if (mode == "register") opts.mode = FillMode::Register;
    else throw Napi::RangeError::New(env, "mode must be 'pread' or 'register', got '" + mode + "'");
  }
  if (o.Has("digestOn") && !o.Get("digestOn").IsUndefined()) opts.gpuDigests = digestOnGpuFromJs(o.Get("digestOn"));
  if (o.Has("group") && !o.Get("group").IsUndefined()) {
    if (!o.Get("group").IsObject()) throw Napi::TypeError::New(env, "group must be { id: string, size: number }");
    Napi::Object g = o.Get("group").As<Napi::Object>();
    opts.groupId = toStr(g.Get("id"), "group.id");
    uint64_t size = toU64(g.Get("size"), "group.size");
    if (opts.groupId.empty() || size < 1 || size > 1024) {
      throw Napi::RangeError::New(env, "group needs a non-empty id and a size from 1 to 1024, got size " + std::to_string(size));
    }
    opts.groupSize = static_cast<unsigned>(size);
  }
  return opts;
}

}  // namespace

FillArgs fillArgsFromJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray() || !info[1].IsTypedArray() || !info[2].IsTypedArray() || !info[3].IsObject()) {
    throw Napi::TypeError::New(env, "startFill(files: string[], ops: Float64Array, zeroRanges: Float64Array, options: object, tensorRanges?: Float64Array)");
  }
  FillArgs args;
  Napi::Array fileArr = info[0].As<Napi::Array>();
  for (uint32_t i = 0; i < fileArr.Length(); ++i) args.files.push_back(toStr(fileArr.Get(i), "file path"));
  args.ops = recordsFromJs<CopyOp>(info[1], "ops");
  args.zeros = zeroRangesFromJs(info[2]);
  args.options = optionsFromJs(info[3].As<Napi::Object>());
  if (info.Length() > 4 && !info[4].IsUndefined()) args.tensors = tensorRangesFromJs(info[4]);
  return args;
}

std::vector<TensorRange> tensorRangesFromJs(const Napi::Value& v) { return recordsFromJs<TensorRange>(v, "tensorRanges"); }

std::vector<ZeroRange> zeroRangesFromJs(const Napi::Value& v) { return recordsFromJs<ZeroRange>(v, "zeroRanges"); }

std::vector<CommitCopy> commitCopiesFromJs(const Napi::Value& v) { return recordsFromJs<CommitCopy>(v, "commitCopies"); }

bool digestOnGpuFromJs(const Napi::Value& v) {
  std::string on = toStr(v, "digestOn");
  if (on == "gpu") return true;
  if (on == "cpu") return false;
  throw Napi::RangeError::New(v.Env(), "digestOn must be 'gpu' or 'cpu', got '" + on + "'");
}

}  // namespace weightd
