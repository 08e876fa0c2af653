// How much memory the host backend may still fill: its segments are memfd pages (shmem), which
// the kernel can neither reclaim nor swap out cheaply, so the budget is what the machine can
// still give without evicting anything (MemAvailable) and, inside a container or systemd unit,
// what its cgroup still allows (v2 memory.max - memory.current, the tightest over its ancestors;
// v1 memory.limit_in_bytes - memory.usage_in_bytes).
#pragma once
#include <cstdint>
#include <string>

namespace weightd {

struct HostMemory {
  uint64_t totalBytes = 0;  // MemTotal, or the cgroup's memory.max when that is smaller
  uint64_t freeBytes = 0;   // min(MemAvailable, memory.max - (memory.current - reclaimable page cache))
  std::string limitedBy;    // "MemAvailable" or the cgroup file that bounds freeBytes, for errors
};

// Reads /proc/meminfo and /sys/fs/cgroup (v2); a file it cannot read bounds nothing.
HostMemory hostMemory();

}  // namespace weightd
