#include "keeper_connection.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <string>

#include "../scm_rights.h"
#include "keeper_store.h"
#include "keeper_wire.h"

namespace weightd::keeper {
namespace {

// The most one recvmsg adds to a frame's buffer: memory follows the bytes that came, never the
// length a header declares.
constexpr size_t kReadChunk = 64 << 10;

}  // namespace

bool InFlight::reserve(Connection* who, size_t n) {
  bool first = waiting_.empty() || waiting_.front() == who;
  if (first && used_ <= limit_ && n <= limit_ - used_) {
    if (!waiting_.empty()) waiting_.pop_front();
    used_ += n;
    return true;
  }
  if (std::find(waiting_.begin(), waiting_.end(), who) == waiting_.end()) waiting_.push_back(who);
  return false;
}

void InFlight::leave(Connection* who) {
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), who), waiting_.end());
}

Connection::Connection(int fd, pid_t peerPid, InFlight& inFlight) : fd_(fd), peerPid_(peerPid), inFlight_(inFlight), idleSince_(Clock::now()) {}

Connection::~Connection() {
  dropFrame();
  inFlight_.release(outBytes_);
  for (Piece& p : out_) closeAll(p.fds);
  ::close(fd_);
}

short Connection::events() const {
  if (!out_.empty()) return POLLOUT;
  return closing_ || parked_ ? 0 : POLLIN;
}

Connection::Phase Connection::phase() const {
  if (watching) return Phase::Watching;
  if (!out_.empty()) return Phase::Replying;
  return in_.empty() ? Phase::Idle : Phase::Receiving;
}

std::optional<Clock::time_point> Connection::holdDeadline() const {
  if (reserved_ == 0) return std::nullopt;
  auto transfer = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(static_cast<double>(reserved_) / kMinLargeRequestRate));
  return reservedAt_ + kHoldGrace + transfer;
}

std::optional<Clock::time_point> Connection::deadline(const Timeouts& t) const {
  switch (phase()) {
    case Phase::Watching: return std::nullopt;
    case Phase::Replying: return replyQueued_ + t.request;
    case Phase::Receiving: return frameStarted_ + t.request;
    case Phase::Idle: return idleSince_ + t.idle;
  }
  return std::nullopt;
}

void Connection::dropFrame() {
  in_ = {};
  length_ = 0;
  inFlight_.release(reserved_);
  reserved_ = 0;
  if (parked_) inFlight_.leave(this);
  parked_ = false;
  closeAll(inFds_);
}

size_t Connection::target() {
  if (in_.size() < kHeaderBytes) return kHeaderBytes;
  if (length_ == 0) length_ = payloadLength(in_.data());
  // A frame of at most kMaxOtherRequestBytes is read at once: with at most kMaxConnections of
  // them, what they hold is bounded, and a request of any op never waits behind large KEEPs.
  if (length_ > kMaxOtherRequestBytes && reserved_ == 0) {
    if (in_.size() == kHeaderBytes) return kHeaderBytes + 1;
    checkLargeRequest(length_, in_[kHeaderBytes], !inFds_.empty());
    parked_ = !inFlight_.reserve(this, length_);
    if (parked_) return 0;
    reserved_ = length_;
    reservedAt_ = Clock::now();
  }
  return kHeaderBytes + length_;
}

std::optional<Request> Connection::read() {
  for (;;) {
    // Never past the end of the current frame: a recvmsg then holds only this frame's bytes, so
    // the fds it brings are this frame's.
    size_t want;
    try {
      want = target();
    } catch (const KeeperError&) {
      // The frame is refused whole: its fds now, and no "mid-request" when the peer then goes.
      dropFrame();
      throw;
    }
    if (want == 0) return std::nullopt;
    if (in_.size() == want) {
      // The payload is moved out, not copied: a 64 MiB KEEP is in memory once.
      in_.erase(in_.begin(), in_.begin() + kHeaderBytes);
      Request r{std::move(in_), std::move(inFds_)};
      inFds_.clear();
      dropFrame();
      idleSince_ = Clock::now();
      return r;
    }
    size_t have = in_.size();
    size_t step = std::min(want - have, kReadChunk);
    // Capacity grows geometrically (amortized copies) but never past the frame's length.
    if (have + step > in_.capacity()) in_.reserve(std::min(want, std::max(have + step, 2 * in_.capacity())));
    in_.resize(have + step);
    size_t fdsBefore = inFds_.size();
    Received got = receiveSomeWithFds(fd_, in_.data() + have, step, inFds_);
    in_.resize(have + (got.bytes > 0 ? static_cast<size_t>(got.bytes) : 0));
    if (have == 0 && got.bytes > 0) frameStarted_ = Clock::now();
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
      size_t installed = inFds_.size() - fdsBefore;
      dropFrame();
      // The kernel also cuts a batch it cannot install whole in the keeper's table: short of
      // kMaxFdsPerMessage, the keeper's own open-file limit is what stopped it, not the sender.
      if (installed < kMaxFdsPerMessage) {
        throw KeeperError("E_TOO_MANY_FDS", "the keeper could take only " + std::to_string(installed) + " of the fds sent on one piece of a request: its open-file limit (RLIMIT_NOFILE) is reached; raise it (LimitNOFILE= in its unit) or keep fewer segments");
      }
      throw KeeperError("E_TOO_MANY_FDS", "more than " + std::to_string(kMaxFdsPerMessage) + " fds arrived on one piece of a request, and the kernel dropped some: send them in batches of at most " +
                                              std::to_string(kFdsPerBatch));
    }
    if (inFds_.size() > kMaxRecordFds) {
      dropFrame();
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
  if (out_.empty()) replyQueued_ = Clock::now();
  inFlight_.charge(frame.size());
  outBytes_ += frame.size();
  if (pieces.size() == 1) {
    out_.push_back({std::move(frame), 0, std::move(fds)});
  } else {
    for (const FdPiece& p : pieces) {
      out_.push_back({std::vector<uint8_t>(frame.begin() + static_cast<std::ptrdiff_t>(p.begin), frame.begin() + static_cast<std::ptrdiff_t>(p.end)), 0,
                      std::vector<int>(fds.begin() + static_cast<std::ptrdiff_t>(p.fdBegin), fds.begin() + static_cast<std::ptrdiff_t>(p.fdEnd))});
    }
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
    if (p.sent == p.bytes.size()) {
      inFlight_.release(p.bytes.size());
      outBytes_ -= p.bytes.size();
      out_.pop_front();
      if (out_.empty()) idleSince_ = Clock::now();
    }
  }
}

}  // namespace weightd::keeper
