// std::thread throws std::system_error when the process or its user is at a thread limit
// (ulimit -u, a pids cgroup). Every thread the addon starts goes through here, so that failure
// is a named DeviceError that fails the fill, not an exception that reaches a destructor of a
// joinable std::thread (std::terminate: the whole daemon aborts).
#pragma once
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "device.h"

namespace weightd {

template <typename F>
std::thread startThread(const std::string& what, F&& body) {
  try {
    return std::thread(std::forward<F>(body));
  } catch (const std::system_error& e) {
    throw DeviceError("E_THREAD_CREATE", "cannot start " + what + ": " + e.what() +
                                             "; this process or user is at its thread limit (ulimit -u, or the container's pids limit): "
                                             "raise the limit, or pass a smaller --load-threads");
  }
}

}  // namespace weightd
