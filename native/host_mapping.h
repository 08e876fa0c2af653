// Client side of the host backend: maps a segment's sealed memfd (received over the socket)
// read-only into this process as an ArrayBuffer, and unmaps it on request (detach) or when the
// buffer is collected.
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
  // Refuses a descriptor that is not sealed against write, shrink and grow, or is shorter than
  // `bytes`. The caller keeps (and closes) `fd`: the mapping does not need it.
  Napi::Value map(Napi::Env env, int fd, uint64_t bytes);
  void unmap(Napi::ArrayBuffer buffer);

 private:
  // Finalizers can run after the owning addon instance is gone, so they hold the state too.
  struct State;
  struct FinalizeHint {
    std::shared_ptr<State> state;
  };
  struct Mapping {
    uint64_t bytes;
    // Which ArrayBuffer owns the mapping: once unmapped, mmap may hand the same address to a
    // new mapping, and the old buffer's late finalizer must not unmap that one.
    const FinalizeHint* owner;
  };
  struct State {
    std::mutex mutex;
    std::map<void*, Mapping> live;  // base -> mapping
  };
  static void release(State& state, void* base, const FinalizeHint* owner);
  std::shared_ptr<State> state_;
};

}  // namespace weightd
