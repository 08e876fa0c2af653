#include "keeper_connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "keeper_store.h"
#include "keeper_wire.h"

namespace weightd::keeper {

Connection::Connection(int fd, pid_t peerPid) : fd_(fd), peerPid_(peerPid) {}

Connection::~Connection() {
  closeAll(inFds_);
  for (Piece& p : out_) closeAll(p.fds);
  ::close(fd_);
}

short Connection::events() const {
  if (!out_.empty()) return POLLOUT;
  return closing_ ? 0 : POLLIN;
}

std::optional<Request> Connection::read() {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
  for (;;) {
    // Never past the end of the current frame: a recvmsg then holds only this frame's bytes, so
    // the fds it brings are this frame's.
    size_t want = kHeaderBytes;
    if (in_.size() >= kHeaderBytes) {
      try {
        want += payloadLength(in_.data());
      } catch (const KeeperError&) {
        // The frame is refused whole: its fds now, and no "mid-request" when the peer then goes.
        in_.clear();
        closeAll(inFds_);
        throw;
      }
    }
    if (in_.size() == want) {
      Request r{std::vector<uint8_t>(in_.begin() + kHeaderBytes, in_.end()), std::move(inFds_)};
      in_.clear();
      inFds_.clear();
      return r;
    }
    size_t have = in_.size();
    in_.resize(want);
    iovec iov{in_.data() + have, want - have};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    in_.resize(have + (n > 0 ? static_cast<size_t>(n) : 0));
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        inFds_.push_back(fd);
      }
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;
      gone_ = true;  // ECONNRESET and the like: the peer has gone
      return std::nullopt;
    }
    if (n == 0) {
      gone_ = true;
      return std::nullopt;
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      closeAll(inFds_);
      throw KeeperError("E_TOO_MANY_FDS", "more than 253 fds arrived on one piece of a request, and the kernel dropped some: send them in batches of at most " +
                                              std::to_string(kFdsPerBatch));
    }
    if (inFds_.size() > kMaxRecordFds) {
      closeAll(inFds_);
      throw KeeperError("E_TOO_MANY_FDS", "a request carries more than " + std::to_string(kMaxRecordFds) + " fds: keep fewer segments per record");
    }
  }
}

void Connection::send(std::vector<uint8_t> frame, std::vector<int> fds) {
  size_t batches = (fds.size() + kFdsPerBatch - 1) / kFdsPerBatch;
  if (batches == 0) {
    out_.push_back({std::move(frame), 0, {}});
    flush();
    return;
  }
  // Each batch on the first byte of its own piece (frames are longer than their batch count:
  // a TAKE reply holds the record's blob).
  for (size_t i = 0; i < batches; ++i) {
    auto begin = frame.begin() + static_cast<std::ptrdiff_t>(i);
    auto end = i + 1 == batches ? frame.end() : begin + 1;
    auto fdBegin = fds.begin() + static_cast<std::ptrdiff_t>(i * kFdsPerBatch);
    auto fdEnd = i + 1 == batches ? fds.end() : fdBegin + static_cast<std::ptrdiff_t>(kFdsPerBatch);
    out_.push_back({std::vector<uint8_t>(begin, end), 0, std::vector<int>(fdBegin, fdEnd)});
  }
  flush();
}

void Connection::flush() {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdsPerBatch)];
  while (!out_.empty() && !gone_) {
    Piece& p = out_.front();
    iovec iov{p.bytes.data() + p.sent, p.bytes.size() - p.sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!p.fds.empty()) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * p.fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * p.fds.size());
      std::memcpy(CMSG_DATA(c), p.fds.data(), sizeof(int) * p.fds.size());
    }
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      gone_ = true;
      return;
    }
    // The kernel attached the fds to the first byte sent: the dups are the client's now.
    closeAll(p.fds);
    p.sent += static_cast<size_t>(n);
    if (p.sent == p.bytes.size()) out_.pop_front();
  }
}

}  // namespace weightd::keeper
