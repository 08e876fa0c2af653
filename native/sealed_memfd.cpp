#include "sealed_memfd.h"

#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>

#include "file_reader.h"

namespace weightd {

std::string servedSealsMissing(int fd) {
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return "not a sealable memfd: " + errnoMessage(errno);
  if ((seals & kServedSeals) == kServedSeals) return "";
  char buf[64];
  snprintf(buf, sizeof buf, "not sealed against write, shrink and grow (seals 0x%x)", static_cast<unsigned>(seals));
  return buf;
}

void* mapSealedReadOnly(int fd, uint64_t bytes) {
  void* base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED && errno == EPERM) base = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  return base;
}

int addSealsWaitingForPins(int fd, int seals) {
  using Clock = std::chrono::steady_clock;
  // The kernel sleeps about 150 ms in all before an EBUSY for held pages; a refusal for a
  // writable mapping comes back without sleeping, so one that took less than this was that.
  constexpr auto kKernelPinWait = std::chrono::milliseconds(100);
  const auto deadline = Clock::now() + std::chrono::milliseconds(kSealPinWaitMs);
  for (;;) {
    auto start = Clock::now();
    if (fcntl(fd, F_ADD_SEALS, seals) == 0) return 0;
    int err = errno;
    if (err == EINTR) continue;
    auto now = Clock::now();
    if (err != EBUSY || now - start < kKernelPinWait || now >= deadline) return err;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace weightd
