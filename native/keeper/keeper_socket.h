// Claims the keeper's socket path: the directory must be this uid's and closed to others, a
// live keeper there is left alone (exit 3), a stale socket is replaced, and the new socket is
// 0600. Failures are SetupError, which main turns into a message and an exit code.
#pragma once
#include <sys/types.h>

#include <stdexcept>
#include <string>

namespace weightd::keeper {

class SetupError : public std::runtime_error {
 public:
  SetupError(int exitCode, const std::string& message) : std::runtime_error(message), exitCode_(exitCode) {}
  int exitCode() const { return exitCode_; }

 private:
  int exitCode_;
};

constexpr int kExitSetup = 2;
constexpr int kExitAlreadyServed = 3;

struct Listener {
  int fd;
  ino_t inode;  // the socket file this keeper made, so it removes only its own at exit
};

Listener listenOn(const std::string& path);
// Removes the socket file if it is still the one listenOn made.
void removeSocket(const std::string& path, const Listener& listener);

}  // namespace weightd::keeper
