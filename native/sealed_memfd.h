// What makes a memfd a served host segment, in one place for the daemon (export, adopt) and the
// client (mapShared): the seals it must carry, and how to map it read-only once sealed.
#pragma once
#include <fcntl.h>

#include <cstdint>
#include <string>

namespace weightd {

// No write (so no process, the daemon included, can change a served byte), no shrink (a
// client's mapping would SIGBUS), no grow. The daemon adds F_SEAL_SEAL too; receivers need
// only these.
constexpr int kServedSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;

// Empty when `fd` carries kServedSeals; else why not ("not a sealable memfd: ...", "seals 0x1"),
// for an error that names the descriptor.
std::string servedSealsMissing(int fd);

// mmap(PROT_READ) of a sealed segment; MAP_FAILED with errno set on failure. Shared where the
// kernel allows it; kernels before 6.7 refuse a shared mapping of a write-sealed memfd opened
// read-write (VM_MAYWRITE), and there a private read-only mapping maps the same pages, with no
// copy, since nothing can write them.
void* mapSealedReadOnly(int fd, uint64_t bytes);

// fcntl(F_ADD_SEALS, seals): 0, or the errno it failed with. F_SEAL_WRITE fails EBUSY for two
// reasons. A shared mapping that may write is refused at once, and stays refused: EBUSY comes
// back. Pages that something else holds a reference to for a moment (a page the kernel's
// compaction is migrating, a pipe that a splice filled, I/O in flight) make the kernel wait about
// 150 ms before it gives up, and on a loaded machine a migration can outlast that: a CI run saw
// it refuse a fresh arena that nothing had mapped. So an EBUSY that took the kernel's wait is
// asked again, for at most kSealPinWaitMs in all.
int addSealsWaitingForPins(int fd, int seals);
constexpr int kSealPinWaitMs = 5000;

}  // namespace weightd
