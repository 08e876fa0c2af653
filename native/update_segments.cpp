#include "update_segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

#include "device.h"
#include "file_reader.h"
#include "host_memory.h"
#include "sealed_memfd.h"

namespace weightd {

namespace {

// The copy is written through the descriptor from a read-only mapping of the source, a window at
// a time, so the kernel makes each page as it is written (as the fill does, host_device.cpp).
constexpr uint64_t kWindowBytes = 64ull << 20;

void copyInto(int dst, const char* src, uint64_t bytes) {
  for (uint64_t at = 0; at < bytes;) {
    ssize_t n = ::pwrite(dst, src + at, std::min(kWindowBytes, bytes - at), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      throw DeviceError(err == ENOSPC || err == ENOMEM ? "E_OUT_OF_MEMORY" : "E_SHM_WRITE",
                        "cannot copy the base version into a new segment at byte " + std::to_string(at) + ": " + errnoMessage(err) +
                            "; free memory or raise the memory limit");
    }
    at += static_cast<uint64_t>(n);
  }
}

// Reserves a copy's pages, refusing first what memory cannot give: as for an arena
// (host_device.cpp), fallocate past what the machine or its cgroup allows may not fail at all but
// wake the OOM killer, which would pick the daemon. One reservation at a time, so copies made at
// once (every segment of an update, several ranks' updates) are each judged against what the
// ones before them took, not all against the same free figure.
std::mutex reserving;

void reserve(int fd, uint64_t bytes, const std::string& name) {
  std::lock_guard<std::mutex> hold(reserving);
  HostMemory memory = hostMemory();
  if (!memory.limitedBy.empty() && bytes > memory.freeBytes) {
    throw DeviceError("E_OUT_OF_MEMORY", "cannot hold " + std::to_string(bytes) + " bytes in " + name + ": only " + std::to_string(memory.freeBytes) +
                                             " bytes are free (" + memory.limitedBy + "); free memory, raise the memory limit, or write fewer tensors");
  }
  if (fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    throw DeviceError("E_OUT_OF_MEMORY", "cannot reserve " + std::to_string(bytes) + " bytes for " + name + ": " + errnoMessage(err) +
                                             "; free memory or raise the memory limit");
  }
}

}  // namespace

int createWritableSegment(uint64_t bytes, const std::string& name) {
  if (bytes == 0) throw DeviceError("E_BAD_PLAN", "a segment of zero bytes cannot be made: " + name);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    int err = errno;
    throw DeviceError("E_SHM_CREATE", "cannot create memfd " + name + ": " + errnoMessage(err) +
                                          (err == EMFILE || err == ENFILE ? "; raise the open-file limit (ulimit -n)" : ""));
  }
  try {
    reserve(fd, bytes, name);
    // A writer's mapping must never lose pages under it (SIGBUS): the size is fixed from here on.
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      int err = errno;
      throw DeviceError("E_SHM_SEAL", "cannot seal " + name + " against shrink and grow: " + errnoMessage(err));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

int createWritableCopy(int sourceFd, uint64_t bytes, const std::string& name) {
  int fd = createWritableSegment(bytes, name);
  void* src = MAP_FAILED;
  try {
    src = mapSealedReadOnly(sourceFd, bytes);
    if (src == MAP_FAILED) {
      int err = errno;
      throw DeviceError("E_SHM_MAP", "cannot map the base segment (fd " + std::to_string(sourceFd) + ") to copy it: " + errnoMessage(err));
    }
    copyInto(fd, static_cast<const char*>(src), bytes);
    munmap(src, bytes);
  } catch (...) {
    if (src != MAP_FAILED) munmap(src, bytes);
    ::close(fd);
    throw;
  }
  return fd;
}

void sealWritten(int fd, uint32_t segment, const std::string& command) {
  // A commit refused for a later segment is asked again: the segments sealed then stay sealed.
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals >= 0 && (seals & F_SEAL_WRITE) != 0) return;
  int err = addSealsWaitingForPins(fd, F_SEAL_WRITE | F_SEAL_SEAL);
  if (err == 0) return;
  if (err == EBUSY) {
    throw DeviceError("E_UPDATE_MAPPED", "segment " + std::to_string(segment) + " is still mapped writable by a process (or its pages are held, as by a splice into a pipe), so " +
                                             command + " cannot seal it; unmap every segment written (close the views written through), then send " + command + " again");
  }
  throw DeviceError("E_SHM_SEAL", "cannot seal segment " + std::to_string(segment) + " of the update against write: " + errnoMessage(err));
}

}  // namespace weightd
