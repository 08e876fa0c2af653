// One client connection of the keeper: reads one request frame at a time together with the fds
// that came with it, and writes replies (fds in batches of kFdsPerBatch, each on its own piece:
// native/scm_rights.h, which the addon's transport uses too) without ever blocking the keeper's loop.
// What a connection may cost is bounded (issue 29): its buffer grows only as bytes arrive, a
// large frame's whole length is reserved from the keeper-wide InFlight budget before its payload
// is read, and each phase has a deadline (a frame from its first byte, a reply from being queued,
// an idle connection from its last reply). A few slow peers cannot starve a prompt one of the
// budget (hardening): frames wait for room in the order they asked, and while any waits, a frame
// holding room must arrive at kMinLargeRequestRate or be refused.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "keeper_store.h"
#include "keeper_wire.h"

namespace weightd::keeper {

struct Request {
  std::vector<uint8_t> payload;
  std::vector<int> fds;  // owned by whoever holds the request
};

class Connection;

// While a large frame waits for room, each frame that holds room must arrive whole within
// kHoldGrace plus its length at kMinLargeRequestRate of getting it, or it is refused
// (E_READ_TIMEOUT): four peers that trickle 64 MiB KEEPs would otherwise hold the whole budget for
// --request-timeout (10 s), past the daemon's 5 s KEEP. A sender on the same host writes a whole
// 64 MiB frame in well under this (it is read from memory); the rule costs nothing uncontended.
constexpr std::chrono::milliseconds kHoldGrace{1000};
constexpr size_t kMinLargeRequestRate = size_t{64} << 20;  // bytes a second

// Bytes of large requests being received (KEEPs past kMaxOtherRequestBytes) and of replies waiting
// to go out, across every connection. A large frame's payload is read only once its declared
// length is reserved here, so a frame once begun always has room to finish (none waits on
// another's bytes); replies are charged as queued and may pass the limit, which then holds every
// new large frame back until they are sent. Frames get room in the order they asked for it: one
// that finds others waiting waits behind them, so a peer that sends frame after frame cannot
// take each room that frees before a frame that has waited longer.
class InFlight {
 public:
  explicit InFlight(size_t limit) : limit_(limit) {}
  // Reserves `n` for `who`'s frame if it is first in line (or none waits) and fits; otherwise
  // puts it in line (once) and returns false.
  bool reserve(Connection* who, size_t n);
  // `who` no longer waits (its frame got room, was dropped, or it closed).
  void leave(Connection* who);
  // The frame that waits longest, if any.
  Connection* next() const { return waiting_.empty() ? nullptr : waiting_.front(); }
  bool contended() const { return !waiting_.empty(); }
  void charge(size_t n) { used_ += n; }
  void release(size_t n) { used_ -= n; }
  size_t used() const { return used_; }
  size_t limit() const { return limit_; }

 private:
  size_t limit_;
  size_t used_ = 0;
  std::deque<Connection*> waiting_;
};

struct Timeouts {
  // A frame must arrive whole within this of its first byte, and a reply be taken whole within
  // this of being queued.
  std::chrono::milliseconds request;
  // A connection with no frame begun and no reply to send is closed after this.
  std::chrono::milliseconds idle;
};

class Connection {
 public:
  enum class Phase { Idle, Receiving, Replying, Watching };

  Connection(int fd, pid_t peerPid, InFlight& inFlight);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();

  int fd() const { return fd_; }
  pid_t peerPid() const { return peerPid_; }
  // What to poll for. No read while a reply waits to go out: a client that sends and never
  // reads then holds at most one reply of the keeper's memory. No read either while the frame
  // waits for its reservation (parked()).
  short events() const;
  // Reads until one whole frame is in (returned), the socket is drained or the frame waits for
  // room in the budget (nullopt), or the peer has gone (gone()). A bad header, a large frame of
  // an op other than KEEP or without fds, or too many fds throws KeeperError; the fds received
  // for the frame are closed whichever way it ends.
  std::optional<Request> read();
  // Queues a reply; `fds` are owned (the keeper's dups) and closed once sent.
  void send(std::vector<uint8_t> frame, std::vector<int> fds = {});
  void flush();
  // Bad input: the error reply goes out, then the connection closes. The frame under way is
  // dropped now, so its room in the budget is free before the reply has gone.
  void closeAfterReply() {
    dropFrame();
    closing_ = true;
  }
  void closeNow() { gone_ = true; }
  bool gone() const { return gone_; }
  bool finished() const { return gone_ || (closing_ && out_.empty()); }
  // True while part of a frame has arrived: a peer gone now was cut off mid-send.
  bool midFrame() const { return !in_.empty(); }
  // The frame's header is in and its length waits for room in the InFlight budget.
  bool parked() const { return parked_; }
  Phase phase() const;
  // When the current phase's time is up; none while watching.
  std::optional<Clock::time_point> deadline(const Timeouts& t) const;
  // When a frame that holds room in the budget must be in while others wait for room (kHoldGrace,
  // kMinLargeRequestRate); none for a frame that holds none.
  std::optional<Clock::time_point> holdDeadline() const;
  // Bytes of the budget the frame under way holds, and since when.
  size_t reserved() const { return reserved_; }
  Clock::time_point reservedAt() const { return reservedAt_; }
  // The frame under way: bytes received, and its whole length (0 before its header is in).
  size_t received() const { return in_.size(); }
  size_t declared() const { return length_ == 0 ? 0 : kHeaderBytes + length_; }
  bool watching = false;

 private:
  struct Piece {
    std::vector<uint8_t> bytes;
    size_t sent = 0;
    std::vector<int> fds;
  };

  // How many bytes of the frame in_ must hold before the next check: its header, then (for a
  // payload past kMaxOtherRequestBytes) its op byte, then all of it once reserved; 0 while parked.
  size_t target();
  // Drops the frame under way: its bytes, its reservation and its fds.
  void dropFrame();

  int fd_;
  pid_t peerPid_;
  InFlight& inFlight_;
  std::vector<uint8_t> in_;
  std::vector<int> inFds_;
  uint32_t length_ = 0;  // the frame's payload length once its header has been checked
  size_t reserved_ = 0;
  Clock::time_point reservedAt_;
  bool parked_ = false;
  std::deque<Piece> out_;
  size_t outBytes_ = 0;  // charged to inFlight_
  bool closing_ = false;
  bool gone_ = false;
  Clock::time_point frameStarted_;
  Clock::time_point replyQueued_;
  Clock::time_point idleSince_;
};

}  // namespace weightd::keeper
