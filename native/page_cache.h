// How much of a set of files the page cache holds right now. The copy engine reads a cold
// checkpoint faster with O_DIRECT and a warm one far faster through the cache (10x on the H200
// host), so the daemon asks before it loads (docs/gpu-results.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace weightd {

struct Residency {
  uint64_t residentBytes = 0;  // of the sampled bytes
  uint64_t sampledBytes = 0;
  uint64_t totalBytes = 0;     // of every file
};

// mincore over read-only mappings of a sample of each file: a 1 MiB window every 64 MiB (files
// up to 64 MiB whole), evenly spread, so the scan costs 1/64 of a full one. A full scan of 26.5 GB
// took 292 ms on the H200 host, on the main thread before the load; the answer only picks cold
// or warm reads (a share against 0.5), which a 1/64 sample of evenly spread windows answers.
// Reads no data and faults nothing in. Throws E_FILE_OPEN naming a file that cannot be opened.
Residency pageCacheResidency(const std::vector<std::string>& paths);

}  // namespace weightd
