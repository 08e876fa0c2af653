// What the peer of a Unix stream socket has not read yet: Node cannot tell a peer that reads
// slowly from one that reads nothing until the kernel's buffer fills, which for small event
// frames takes hours. The serving layer uses it to drop a watcher that leaves its events unread.
#pragma once
#include <cstdint>

namespace weightd {

// SIOCOUTQ on a connected AF_UNIX stream socket: what was sent on `fd` and is still queued at the
// peer, in the kernel's accounting (buffer sizes, so more than the bytes; 0 exactly when the peer
// has read everything). Throws E_SOCKET_QUEUE.
uint64_t unreadBytes(int fd);

}  // namespace weightd
