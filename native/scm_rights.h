// Descriptors over an AF_UNIX stream socket (SCM_RIGHTS), one sendmsg or recvmsg call at a time:
// the one implementation under the addon's transport (unix_fds.cpp) and the keeper's connection
// (keeper/keeper_connection.cpp). Plain C++ with no error types of its own, because the keeper is
// a program without the addon: each caller turns a failure into its own error and decides how
// to wait (the addon polls against a deadline, the keeper returns to its poll loop).
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace weightd {

// The kernel's SCM_MAX_FD: more fds on one message are dropped (MSG_CTRUNC).
constexpr size_t kMaxFdsPerMessage = 253;
// At most this many fds ride on one sendmsg piece, each batch on the first byte of its own piece:
// Linux ends a recvmsg after a piece that carried fds, so a reader gets the batches in order and
// never two in one call.
constexpr size_t kFdsPerBatch = 250;

// One sendmsg piece: bytes [begin, end) of a frame, with fds [fdBegin, fdEnd) on its first byte.
struct FdPiece {
  size_t begin, end, fdBegin, fdEnd;
};

// How a frame of `frameBytes` carrying `fdCount` fds is cut into pieces: one piece without fds,
// else one byte per batch and the rest of the frame on the last. Empty when the frame is shorter
// than its batch count (each batch needs a byte of its own): the caller refuses that.
std::vector<FdPiece> fdPieces(size_t frameBytes, size_t fdCount);

// One non-blocking sendmsg (MSG_NOSIGNAL) of [data, data + size) with `fdCount` fds (at most
// kFdsPerBatch, else -1 with EINVAL) attached to its first byte. Returns what sendmsg returns,
// errno set on -1. The kernel attaches the fds to the first byte sent, even in a partial write;
// the caller keeps its fds.
ssize_t sendSomeWithFds(int sock, const uint8_t* data, size_t size, const int* fds, size_t fdCount);

struct Received {
  ssize_t bytes;      // what recvmsg returned: 0 at end of stream, -1 with `error` set
  int error;          // errno when bytes < 0, else 0
  bool fdsTruncated;  // MSG_CTRUNC: the peer sent more than kMaxFdsPerMessage fds on one piece
};

// One non-blocking recvmsg (MSG_CMSG_CLOEXEC) into [data, data + size). Every fd that came with
// the bytes is appended to `fds` before anything is checked, so whoever owns `fds` closes them
// whichever way the caller then fails.
Received receiveSomeWithFds(int sock, uint8_t* data, size_t size, std::vector<int>& fds);

}  // namespace weightd
