#include "read_ranges.h"

#include <algorithm>

namespace weightd {

void appendNeeded(const CopyOp& op, std::vector<ByteRange>& out) {
  if (!readsRowsApart(op)) {
    out.push_back({op.srcOffset, op.srcOffset + (op.rows - 1) * op.srcPitch + op.rowBytes});
    return;
  }
  for (uint64_t r = 0; r < op.rows; ++r) out.push_back({op.srcOffset + r * op.srcPitch, op.srcOffset + r * op.srcPitch + op.rowBytes});
}

std::vector<ByteRange> coalesceReads(std::vector<ByteRange> needed, uint64_t align) {
  for (ByteRange& r : needed) r.start = r.start / align * align;
  std::sort(needed.begin(), needed.end(), [](const ByteRange& a, const ByteRange& b) { return a.start < b.start; });
  std::vector<ByteRange> out;
  for (const ByteRange& r : needed) {
    if (!out.empty() && r.start < (out.back().end + align - 1) / align * align + kMinSkippedGap) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace weightd
