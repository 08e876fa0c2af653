// Descriptors over AF_UNIX stream sockets (SCM_RIGHTS): the one native transport for memfds and
// CUDA VMM handles, between the daemon, the keeper and clients. Plain C++, no Node-API; blocking
// calls bounded by a timeout, run by the bindings on a libuv thread, except the daemon's replies,
// which go from the event loop (src/wire/socketFdWriter.ts).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "device.h"
#include "scm_rights.h"

namespace weightd {

// Every frame of weightd's Unix protocols starts with 4 magic bytes, a u16 BE version and a u32
// BE payload length.
constexpr size_t kFrameHeaderBytes = 10;

// A frame and its fds on their way out of a connected stream socket: each sendSome sends what the
// socket takes at once (MSG_DONTWAIT, whatever the socket's mode) and returns, so a send that
// meets a full socket resumes where it stopped, on whatever waits for the socket (a poll here, the
// event loop in src/wire/socketFdWriter.ts). The fds go as SCM_RIGHTS in batches of
// kFdsPerBatch, each batch on the first byte of its own piece (scm_rights.h). The caller keeps its fds open until done.
class FdSend {
 public:
  // E_FD_SEND when the frame has too few bytes for the fds' batches.
  FdSend(std::vector<uint8_t> frame, std::vector<int> fds);
  // True once every byte has gone; false when the socket takes no more now. E_FD_SEND on an error.
  bool sendSome(int sock);
  // "sending N bytes and M fds on socket fd S", for an error's message.
  std::string what(int sock) const;
  // Bytes of the frame not yet sent: 0 once sendSome returned true.
  size_t bytesLeft() const { return frame_.size() - sent_; }

 private:
  void startPiece();  // at the first byte of pieces_[piece_]

  std::vector<uint8_t> frame_;
  std::vector<int> fds_;
  std::vector<FdPiece> pieces_;
  size_t piece_ = 0;
  size_t sent_ = 0;
  bool fdsSent_ = false;  // the current piece's batch went with an earlier byte
};

// E_FD_TIMEOUT: `what` did not finish within `totalMs`.
DeviceError timeoutError(const std::string& what, int64_t totalMs);

struct UnixReply {
  std::vector<uint8_t> frame;  // header included
  std::vector<int> fds;        // owned by the caller, O_CLOEXEC
};

// Connects to `path`, refuses a server of another uid (E_PEER_UID), sends `frame` and `fds` as
// FdSend does (waiting on this thread for the socket to take them), reads exactly one reply
// frame (at most maxReplyBytes, header included) and every fd that came with it, and closes the
// socket. On any failure every fd received is closed.
// Throws E_CONNECT, E_PEER_UID, E_FD_SEND, E_FD_TIMEOUT, E_FD_RECV, E_FRAME_TOO_LARGE, E_PEER_CLOSED.
UnixReply unixRequest(const std::string& path, const std::vector<uint8_t>& frame, const std::vector<int>& fds,
                      int64_t timeoutMs, uint64_t maxReplyBytes);

// Throws E_FD_CLOSE for a descriptor this process does not have open (a double close is a bug).
void closeFd(int fd);

// Opens `path` read-only (O_CLOEXEC) for the addon to own: a descriptor Node's fs opened would be
// closed again by Node when its thread's environment ends, after the addon closed it already (and
// the number may be another file's by then).
int openReadOnly(const std::string& path);

// A new descriptor of the same open file as `fd` (close-on-exec), the caller's to close: a
// reference of its own to what `fd` holds, for a file that cannot be opened anew by path (a CUDA
// VMM export). E_FD_OPEN.
int dupFd(int fd);

}  // namespace weightd
