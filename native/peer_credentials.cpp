#include "peer_credentials.h"

#include <sys/socket.h>

#include <cerrno>
#include <string>

#include "device.h"
#include "file_reader.h"

namespace weightd {

Credentials peerCredentials(int fd) {
  struct ucred cred {};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    int err = errno;
    throw DeviceError("E_PEERCRED", "cannot read the peer credentials of socket fd " + std::to_string(fd) + ": " + errnoMessage(err));
  }
  return {cred.pid, cred.uid, cred.gid};
}

}  // namespace weightd
