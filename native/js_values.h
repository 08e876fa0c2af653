// JS values read as C++ values, with a TypeError or RangeError naming the argument when a value
// is not what the binding needs. Shared by the bindings (addon.cpp, fill_args.cpp).
#pragma once
#include <napi.h>

#include <cstdint>
#include <limits>
#include <string>

namespace weightd {

// A JS number that is a non-negative integer JS can hold exactly (the order of the tests keeps
// the cast defined).
inline bool isSafeU64(double d) {
  return d >= 0 && d <= 9007199254740991.0 && d == static_cast<double>(static_cast<uint64_t>(d));
}

inline uint64_t toU64(const Napi::Value& v, const char* what) {
  if (!v.IsNumber()) throw Napi::TypeError::New(v.Env(), std::string(what) + " must be a number");
  double d = v.As<Napi::Number>().DoubleValue();
  if (!isSafeU64(d)) {
    throw Napi::RangeError::New(v.Env(), std::string(what) + " must be a non-negative safe integer, got " + std::to_string(d));
  }
  return static_cast<uint64_t>(d);
}

// An index or count narrowed to T: a cast of a value past T's range would be undefined behaviour
// (and a file index of 2^32 would quietly become file 0).
template <typename T>
T toBounded(const Napi::Value& v, const char* what, uint64_t max = std::numeric_limits<T>::max()) {
  uint64_t n = toU64(v, what);
  if (n > max) throw Napi::RangeError::New(v.Env(), std::string(what) + " must be at most " + std::to_string(max) + ", got " + std::to_string(n));
  return static_cast<T>(n);
}

inline std::string toStr(const Napi::Value& v, const char* what) {
  if (!v.IsString()) throw Napi::TypeError::New(v.Env(), std::string(what) + " must be a string");
  return v.As<Napi::String>().Utf8Value();
}

}  // namespace weightd
