#include "unix_fds.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "device.h"
#include "file_reader.h"
#include "peer_credentials.h"
#include "scm_rights.h"

namespace weightd {
namespace {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  explicit Deadline(int64_t ms) : totalMs_(ms), end_(Clock::now() + std::chrono::milliseconds(ms)) {}
  // Rounded up, so a wait of less than a millisecond does not spin on poll(…, 0).
  int remainingMs() const {
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(end_ - Clock::now()).count();
    if (left <= 0) return 0;
    int64_t ms = (left + 999) / 1000;
    return ms > 1 << 30 ? 1 << 30 : static_cast<int>(ms);
  }
  int64_t totalMs() const { return totalMs_; }

 private:
  int64_t totalMs_;
  Clock::time_point end_;
};

// Closes what it holds unless released: every error path of unixRequest closes the socket and
// every fd received so far.
class OwnedFds {
 public:
  OwnedFds() = default;
  OwnedFds(const OwnedFds&) = delete;
  OwnedFds& operator=(const OwnedFds&) = delete;
  ~OwnedFds() {
    for (int fd : fds_) ::close(fd);
  }
  // Where a receive appends what it takes.
  std::vector<int>& list() { return fds_; }
  std::vector<int> release() { return std::move(fds_); }

 private:
  std::vector<int> fds_;
};

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits until `fd` is ready for `events` (or has an error or hang-up, which the next call
// reports); E_FD_TIMEOUT once the deadline has passed.
void waitFor(int fd, short events, const Deadline& deadline, const std::string& what) {
  for (;;) {
    int left = deadline.remainingMs();
    if (left == 0) throw timeoutError(what, deadline.totalMs());
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, left);
    if (r > 0) return;
    if (r < 0 && errno != EINTR) {
      int err = errno;
      throw DeviceError("E_FD_SEND", "poll on socket fd " + std::to_string(fd) + " failed: " + errnoMessage(err));
    }
  }
}

void sendAll(int sock, const std::vector<uint8_t>& frame, const std::vector<int>& fds, const Deadline& deadline) {
  FdSend send(frame, fds);
  while (!send.sendSome(sock)) waitFor(sock, POLLOUT, deadline, send.what(sock));
}

// Connects `fd`, a fresh AF_UNIX stream socket, to `path`, then makes it non-blocking.
void connectTo(int fd, const std::string& path, const Deadline& deadline) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    throw DeviceError("E_CONNECT", "socket path \"" + path + "\" is " + std::to_string(path.size()) + " bytes; a Unix socket path needs 1 to " +
                                       std::to_string(sizeof addr.sun_path - 1) + ": use a shorter directory");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  // A Unix connect blocks only while the server's backlog is full: SO_SNDTIMEO bounds that wait.
  // At least 1 ms: a zero SO_SNDTIMEO would mean no bound at all.
  int ms = std::max(1, deadline.remainingMs());
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int r;
  do {
    r = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    int err = errno;
    if (err == EAGAIN || err == EINPROGRESS) {
      throw DeviceError("E_FD_TIMEOUT", "connecting to " + path + " did not finish within " + std::to_string(deadline.totalMs()) + " ms: its server accepts no connection");
    }
    std::string why = err == ENOENT         ? " (ENOENT): no socket there; is the server running, and is the path right?"
                      : err == ECONNREFUSED ? " (ECONNREFUSED): nothing listens there; the socket is stale, start the server again"
                                            : "";
    throw DeviceError("E_CONNECT", "cannot connect to " + path + ": " + errnoMessage(err) + why);
  }
  timeval none{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// Reads into frame[got, want) and takes every fd that comes with the bytes.
size_t receiveSome(int sock, std::vector<uint8_t>& frame, size_t got, size_t want, OwnedFds& fds, const std::string& path, const Deadline& deadline) {
  for (;;) {
    Received r = receiveSomeWithFds(sock, frame.data() + got, want - got, fds.list());
    if (r.bytes < 0) {
      if (r.error == EINTR) continue;
      if (r.error == EAGAIN || r.error == EWOULDBLOCK) {
        waitFor(sock, POLLIN, deadline, "the reply from " + path);
        continue;
      }
      throw DeviceError("E_FD_RECV", "recvmsg from " + path + " failed after " + std::to_string(got) + " reply bytes: " + errnoMessage(r.error));
    }
    if (r.fdsTruncated) {
      throw DeviceError("E_FD_RECV", path + " sent more than " + std::to_string(kMaxFdsPerMessage) + " fds on one piece of its reply, so the kernel dropped some; the server must send them in batches of at most " +
                                         std::to_string(kFdsPerBatch));
    }
    if (r.bytes == 0) {
      throw DeviceError("E_PEER_CLOSED", path + " closed the connection after " + std::to_string(got) + " of " +
                                             (want == kFrameHeaderBytes ? std::string("at least ") + std::to_string(want) : std::to_string(want)) +
                                             " reply bytes; see the server's log for why");
    }
    return got + static_cast<size_t>(r.bytes);
  }
}

}  // namespace

DeviceError timeoutError(const std::string& what, int64_t totalMs) {
  return DeviceError("E_FD_TIMEOUT", what + " did not finish within " + std::to_string(totalMs) + " ms; the peer is stuck or overloaded: retry, or raise the timeout");
}

FdSend::FdSend(std::vector<uint8_t> frame, std::vector<int> fds) : frame_(std::move(frame)), fds_(std::move(fds)), pieces_(fdPieces(frame_.size(), fds_.size())) {
  if (pieces_.empty()) {
    throw DeviceError("E_FD_SEND", "a frame of " + std::to_string(frame_.size()) + " bytes cannot carry " + std::to_string(fds_.size()) +
                                       " fds: each batch of " + std::to_string(kFdsPerBatch) + " needs a byte of its own");
  }
  startPiece();
}

void FdSend::startPiece() {
  sent_ = pieces_[piece_].begin;
  fdsSent_ = pieces_[piece_].fdBegin == pieces_[piece_].fdEnd;  // a piece without a batch has none to send
}

std::string FdSend::what(int sock) const {
  return "sending " + std::to_string(frame_.size()) + " bytes and " + std::to_string(fds_.size()) + " fds on socket fd " + std::to_string(sock);
}

bool FdSend::sendSome(int sock) {
  while (piece_ < pieces_.size()) {
    const FdPiece& piece = pieces_[piece_];
    while (sent_ < piece.end) {
      size_t fdCount = fdsSent_ ? 0 : piece.fdEnd - piece.fdBegin;
      ssize_t n = sendSomeWithFds(sock, frame_.data() + sent_, piece.end - sent_, fds_.data() + piece.fdBegin, fdCount);
      if (n > 0) {
        sent_ += static_cast<size_t>(n);
        fdsSent_ = true;  // the kernel attaches a message's fds to its first byte, even in a partial write
        continue;
      }
      int err = errno;
      if (n < 0 && err == EINTR) continue;
      if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) return false;
      throw DeviceError("E_FD_SEND", "sendmsg on socket fd " + std::to_string(sock) + " failed after " + std::to_string(sent_) + " of " +
                                         std::to_string(frame_.size()) + " bytes (" + std::to_string(fds_.size()) + " fds): " + errnoMessage(err) +
                                         (err == EBADF || err == ENOTSOCK ? "; pass a connected AF_UNIX socket and open fds" : ""));
    }
    if (++piece_ < pieces_.size()) startPiece();
  }
  return true;
}


UnixReply unixRequest(const std::string& path, const std::vector<uint8_t>& frame, const std::vector<int>& fds, int64_t timeoutMs,
                      uint64_t maxReplyBytes) {
  Deadline deadline(timeoutMs);
  Socket sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sock.fd() < 0) {
    int err = errno;
    throw DeviceError("E_CONNECT", "cannot create a Unix socket to connect to " + path + ": " + errnoMessage(err));
  }
  connectTo(sock.fd(), path, deadline);
  Credentials peer = peerCredentials(sock.fd());
  if (peer.uid != ::geteuid()) {
    throw DeviceError("E_PEER_UID", "the server on " + path + " runs as uid " + std::to_string(peer.uid) + ", not this process's uid " +
                                        std::to_string(::geteuid()) + "; refusing to exchange descriptors with another user: check who started it");
  }
  sendAll(sock.fd(), frame, fds, deadline);

  std::vector<uint8_t> reply(kFrameHeaderBytes);
  OwnedFds received;
  size_t got = 0;
  while (got < kFrameHeaderBytes) got = receiveSome(sock.fd(), reply, got, kFrameHeaderBytes, received, path, deadline);
  uint64_t payload = (uint64_t{reply[6]} << 24) | (uint64_t{reply[7]} << 16) | (uint64_t{reply[8]} << 8) | uint64_t{reply[9]};
  uint64_t total = kFrameHeaderBytes + payload;
  if (total > maxReplyBytes) {
    throw DeviceError("E_FRAME_TOO_LARGE", "the reply from " + path + " declares " + std::to_string(total) + " bytes, more than the " +
                                               std::to_string(maxReplyBytes) + " this request allows; the server is not the one expected or is broken");
  }
  reply.resize(total);
  while (got < total) got = receiveSome(sock.fd(), reply, got, total, received, path, deadline);
  return {std::move(reply), received.release()};
}

int openReadOnly(const std::string& path) {
  int fd;
  do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int err = errno;
    throw DeviceError("E_FD_OPEN", "cannot open " + path + " read-only: " + errnoMessage(err));
  }
  return fd;
}

int dupFd(int fd) {
  int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) {
    int err = errno;
    throw DeviceError("E_FD_OPEN", "cannot duplicate fd " + std::to_string(fd) + ": " + errnoMessage(err) + (err == EMFILE ? "; raise the open-file limit (ulimit -n)" : ""));
  }
  return copy;
}

void closeFd(int fd) {
  if (::close(fd) != 0 && errno == EBADF) {
    throw DeviceError("E_FD_CLOSE", "fd " + std::to_string(fd) + " is not open in this process; it was closed already (a double close would close another file's fd)");
  }
}

}  // namespace weightd
