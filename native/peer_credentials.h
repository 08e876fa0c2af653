// SO_PEERCRED for a connected Unix socket: Node has no API for it, and the serving layer must
// know who is on the other end before it hands out memory.
#pragma once
#include <sys/types.h>

namespace weightd {

struct Credentials {
  pid_t pid;
  uid_t uid;
  gid_t gid;
};

Credentials peerCredentials(int fd);

}  // namespace weightd
