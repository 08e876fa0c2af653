// The `content` fingerprint's per-file digest (docs/spec/fingerprint.md) on a libuv thread:
// xxh3-128 of the sampled ranges' bytes, concatenated in file order, as
// src/checkpoint/sampleContent.ts's fileContentDigest computes it on a pool thread. Which ranges
// are sampled stays that file's rule; this only reads and hashes them. A daemon planning its
// checkpoint samples here, so that it starts no worker thread for it (each took ~100 ms of a
// start, more than the few thousand reads of the page cache it spared the main thread).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace weightd {

struct SampledDigest {
  std::string digest;       // 32 lowercase hex digits; empty when a read failed or ended
  int64_t endedAt = -1;     // the offset where the file ended before the ranges did
  int64_t failedAt = -1;    // the offset whose read failed, with why
  std::string reason;
};

// `ranges` are [begin, end) pairs, ascending and disjoint, read from `fd` (open for reading, left
// open) with one pread per run of ranges at most `mergeGap` bytes apart.
SampledDigest sampledDigest(int fd, const std::vector<uint64_t>& ranges, uint64_t mergeGap);

}  // namespace weightd
