#include "unread_bytes.h"

#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <cerrno>
#include <string>

#include "device.h"
#include "file_reader.h"

namespace weightd {

uint64_t unreadBytes(int fd) {
  int queued = 0;
  if (ioctl(fd, SIOCOUTQ, &queued) != 0) {
    int err = errno;
    throw DeviceError("E_SOCKET_QUEUE", "cannot read the unread bytes of socket fd " + std::to_string(fd) + ": " + errnoMessage(err));
  }
  return queued < 0 ? 0 : static_cast<uint64_t>(queued);
}

}  // namespace weightd
