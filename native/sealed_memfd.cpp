#include "sealed_memfd.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>

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

}  // namespace weightd
