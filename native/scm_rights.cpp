#include "scm_rights.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace weightd {

std::vector<FdPiece> fdPieces(size_t frameBytes, size_t fdCount) {
  size_t batches = (fdCount + kFdsPerBatch - 1) / kFdsPerBatch;
  if (batches == 0) return {{0, frameBytes, 0, 0}};
  if (frameBytes < batches) return {};
  std::vector<FdPiece> pieces;
  for (size_t i = 0; i < batches; ++i) {
    size_t end = i + 1 == batches ? frameBytes : i + 1;
    pieces.push_back({i, end, i * kFdsPerBatch, std::min(fdCount, (i + 1) * kFdsPerBatch)});
  }
  return pieces;
}

ssize_t sendSomeWithFds(int sock, const uint8_t* data, size_t size, const int* fds, size_t fdCount) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdsPerBatch)];
  // More would overrun `control`: the callers cut batches with fdPieces, so this is a bug of theirs.
  if (fdCount > kFdsPerBatch) {
    errno = EINVAL;
    return -1;
  }
  iovec iov{const_cast<uint8_t*>(data), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fdCount > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fdCount);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fdCount);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * fdCount);
  }
  return ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

Received receiveSomeWithFds(int sock, uint8_t* data, size_t size, std::vector<int>& fds) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  iovec iov{data, size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return {n, errno, false};
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.push_back(fd);
    }
  }
  return {n, 0, (msg.msg_flags & MSG_CTRUNC) != 0};
}

}  // namespace weightd
