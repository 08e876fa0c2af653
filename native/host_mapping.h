// Client side of the host backend: maps a segment file read-only into this process as an
// ArrayBuffer, and unmaps it on request (detach) or when the buffer is collected.
#pragma once
#include <napi.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace weightd {

class HostMappings {
 public:
  HostMappings() : state_(std::make_shared<State>()) {}
  Napi::Value map(Napi::Env env, const std::string& path, uint64_t bytes);
  void unmap(Napi::ArrayBuffer buffer);

 private:
  // Finalizers can run after the owning addon instance is gone, so they hold the state too.
  struct State {
    std::mutex mutex;
    std::map<void*, uint64_t> live;  // base -> length
  };
  struct FinalizeHint {
    std::shared_ptr<State> state;
  };
  static void release(State& state, void* base);
  std::shared_ptr<State> state_;
};

}  // namespace weightd
