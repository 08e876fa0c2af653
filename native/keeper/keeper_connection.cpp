#include "keeper_connection.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>

#include "../scm_rights.h"
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
    Received got = receiveSomeWithFds(fd_, in_.data() + have, want - have, inFds_);
    in_.resize(have + (got.bytes > 0 ? static_cast<size_t>(got.bytes) : 0));
    if (got.bytes < 0) {
      if (got.error == EINTR) continue;
      if (got.error == EAGAIN || got.error == EWOULDBLOCK) return std::nullopt;
      gone_ = true;  // ECONNRESET and the like: the peer has gone
      return std::nullopt;
    }
    if (got.bytes == 0) {
      gone_ = true;
      return std::nullopt;
    }
    if (got.fdsTruncated) {
      closeAll(inFds_);
      throw KeeperError("E_TOO_MANY_FDS", "more than " + std::to_string(kMaxFdsPerMessage) + " fds arrived on one piece of a request, and the kernel dropped some: send them in batches of at most " +
                                              std::to_string(kFdsPerBatch));
    }
    if (inFds_.size() > kMaxRecordFds) {
      closeAll(inFds_);
      throw KeeperError("E_TOO_MANY_FDS", "a request carries more than " + std::to_string(kMaxRecordFds) + " fds: keep fewer segments per record");
    }
  }
}

void Connection::send(std::vector<uint8_t> frame, std::vector<int> fds) {
  // Each batch on the first byte of its own piece (frames are longer than their batch count:
  // a TAKE reply holds the record's blob).
  std::vector<FdPiece> pieces = fdPieces(frame.size(), fds.size());
  if (pieces.empty()) {
    closeAll(fds);
    throw std::logic_error("a reply of " + std::to_string(frame.size()) + " bytes cannot carry " + std::to_string(fds.size()) + " fds");
  }
  for (const FdPiece& p : pieces) {
    out_.push_back({std::vector<uint8_t>(frame.begin() + static_cast<std::ptrdiff_t>(p.begin), frame.begin() + static_cast<std::ptrdiff_t>(p.end)), 0,
                    std::vector<int>(fds.begin() + static_cast<std::ptrdiff_t>(p.fdBegin), fds.begin() + static_cast<std::ptrdiff_t>(p.fdEnd))});
  }
  flush();
}

void Connection::flush() {
  while (!out_.empty() && !gone_) {
    Piece& p = out_.front();
    ssize_t n = sendSomeWithFds(fd_, p.bytes.data() + p.sent, p.bytes.size() - p.sent, p.fds.data(), p.fds.size());
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
