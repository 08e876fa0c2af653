// One client connection of the keeper: reads one request frame at a time together with the fds
// that came with it, and writes replies (fds in batches of kFdsPerBatch, each on its own piece:
// native/scm_rights.h, which the addon's transport uses too) without ever blocking the keeper's loop.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace weightd::keeper {

struct Request {
  std::vector<uint8_t> payload;
  std::vector<int> fds;  // owned by whoever holds the request
};

class Connection {
 public:
  Connection(int fd, pid_t peerPid);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();

  int fd() const { return fd_; }
  pid_t peerPid() const { return peerPid_; }
  // What to poll for. No read while a reply waits to go out: a client that sends and never
  // reads then holds at most one reply of the keeper's memory.
  short events() const;
  // Reads until one whole frame is in (returned), the socket is drained (nullopt), or the peer
  // has gone (gone()). A bad header or too many fds throws KeeperError; the fds received for the
  // frame are closed whichever way it ends.
  std::optional<Request> read();
  // Queues a reply; `fds` are owned (the keeper's dups) and closed once sent.
  void send(std::vector<uint8_t> frame, std::vector<int> fds = {});
  void flush();
  // Bad input: the error reply goes out, then the connection closes.
  void closeAfterReply() { closing_ = true; }
  void closeNow() { gone_ = true; }
  bool gone() const { return gone_; }
  bool finished() const { return gone_ || (closing_ && out_.empty()); }
  // True while part of a frame has arrived: a peer gone now was cut off mid-send.
  bool midFrame() const { return !in_.empty(); }
  bool watching = false;

 private:
  struct Piece {
    std::vector<uint8_t> bytes;
    size_t sent = 0;
    std::vector<int> fds;
  };

  int fd_;
  pid_t peerPid_;
  std::vector<uint8_t> in_;
  std::vector<int> inFds_;
  std::deque<Piece> out_;
  bool closing_ = false;
  bool gone_ = false;
};

}  // namespace weightd::keeper
