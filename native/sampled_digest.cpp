#include "sampled_digest.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "file_reader.h"
#include "xxh3_128.h"

namespace weightd {

SampledDigest sampledDigest(int fd, const std::vector<uint64_t>& ranges, uint64_t mergeGap) {
  SampledDigest out;
  uint64_t sampled = 0;
  for (size_t i = 0; i + 1 < ranges.size(); i += 2) sampled += ranges[i + 1] - ranges[i];
  std::vector<unsigned char> sample(sampled);
  std::vector<unsigned char> scratch;
  uint64_t at = 0;
  for (size_t i = 0; i + 1 < ranges.size();) {
    // One read covers every range whose gap to the previous is small.
    size_t j = i + 2;
    while (j + 1 < ranges.size() && ranges[j] - ranges[j - 1] <= mergeGap) j += 2;
    const uint64_t from = ranges[i];
    const uint64_t to = ranges[j - 1];
    if (scratch.size() < to - from) scratch.resize(to - from);
    for (uint64_t done = 0; done < to - from;) {
      ssize_t n = ::pread(fd, scratch.data() + done, to - from - done, static_cast<off_t>(from + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        out.failedAt = static_cast<int64_t>(from + done);
        out.reason = errnoMessage(errno);
        return out;
      }
      if (n == 0) {
        out.endedAt = static_cast<int64_t>(from + done);
        return out;
      }
      done += static_cast<uint64_t>(n);
    }
    for (size_t r = i; r < j; r += 2) {
      std::memcpy(sample.data() + at, scratch.data() + (ranges[r] - from), ranges[r + 1] - ranges[r]);
      at += ranges[r + 1] - ranges[r];
    }
    i = j;
  }
  unsigned char digest[16];
  xxh3_128(sample.data(), sample.size(), digest);
  out.digest = hexOf(digest, sizeof digest);
  return out;
}

}  // namespace weightd
