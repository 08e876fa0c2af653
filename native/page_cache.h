// How much of a set of files the page cache holds right now. The copy engine reads a cold
// checkpoint faster with O_DIRECT and a warm one far faster through the cache (10x on the H200
// host), so the daemon asks before it loads (docs/gpu-results.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace weightd {

struct Residency {
  uint64_t residentBytes = 0;
  uint64_t totalBytes = 0;
};

// mincore over a read-only mapping of each file, a window at a time; reads no data and faults
// nothing in. Throws E_FILE_OPEN naming a file that cannot be opened.
Residency pageCacheResidency(const std::vector<std::string>& paths);

}  // namespace weightd
