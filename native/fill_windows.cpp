#include "fill_windows.h"

#include <algorithm>

namespace weightd {

namespace {

struct Span {
  uint32_t member;
  const CopyOp* op;
  uint64_t start;
  uint64_t end;
};

// Appends the pieces of `op` that lie inside [ws, we).
void clip(uint32_t member, const CopyOp& op, uint64_t ws, uint64_t we, std::vector<WindowPiece>& out) {
  auto piece = [&](uint64_t src, uint64_t dst, uint64_t rows, uint64_t rowBytes) {
    CopyOp c = op;
    c.srcOffset = src;
    c.dstOffset = dst;
    c.rows = rows;
    c.rowBytes = rowBytes;
    c.srcPitch = rows > 1 ? op.srcPitch : rowBytes;
    out.push_back(WindowPiece{member, c});
  };
  const uint64_t s = op.srcOffset, n = op.rowBytes;
  if (op.rows <= 1) {
    uint64_t a = std::max(ws, s), b = std::min(we, s + n);
    if (a < b) piece(a, op.dstOffset + (a - s), 1, b - a);
    return;
  }
  const uint64_t p = op.srcPitch;
  if (we <= s) return;
  // The first row that ends after ws and the last that starts before we.
  uint64_t lo = ws >= s + n ? (ws - s - n) / p + 1 : 0;
  uint64_t hi = std::min(op.rows - 1, (we - 1 - s) / p);
  if (lo > hi) return;
  auto rowStart = [&](uint64_t r) { return s + r * p; };
  auto whole = [&](uint64_t r) { return rowStart(r) >= ws && rowStart(r) + n <= we; };
  auto part = [&](uint64_t r) {
    uint64_t a = std::max(ws, rowStart(r)), b = std::min(we, rowStart(r) + n);
    piece(a, op.dstOffset + r * n + (a - rowStart(r)), 1, b - a);
  };
  // Rows strictly between the first and the last are whole: only the two edge rows can be cut.
  uint64_t first = lo, last = hi;
  if (!whole(lo)) {
    part(lo);
    ++first;
  }
  if (hi >= first && !whole(hi)) {
    part(hi);
    last = hi - 1;  // hi >= first >= 0 and hi is not whole, so hi > lo >= 0 when first == lo
  }
  if (first <= last) piece(rowStart(first), op.dstOffset + first * n, last - first + 1, n);
}

// Orders windows so that neighbours in the work queue feed different GPUs. In file order, runs
// of windows go to one GPU alone (each GPU's half of a column-split tensor is contiguous), and
// the reader threads, which take windows in queue order, would load one GPU's link at a time.
// Each window is given to the member it feeds that has been given the fewest bytes so far
// (a window feeding several members counts for one), and the members' lists are interleaved.
std::vector<FillWindow> interleave(std::vector<FillWindow> windows, size_t members) {
  if (members < 2) return windows;
  std::vector<std::vector<size_t>> queues(members);
  std::vector<uint64_t> given(members, 0);
  for (size_t i = 0; i < windows.size(); ++i) {
    uint32_t best = windows[i].pieces.front().member;
    for (const WindowPiece& p : windows[i].pieces) {
      if (given[p.member] < given[best]) best = p.member;
    }
    given[best] += windows[i].end - windows[i].start;
    queues[best].push_back(i);
  }
  std::vector<FillWindow> out;
  out.reserve(windows.size());
  for (size_t k = 0; out.size() < windows.size(); ++k) {
    for (auto& q : queues) {
      if (k < q.size()) out.push_back(std::move(windows[q[k]]));
    }
  }
  return out;
}

}  // namespace

std::vector<ByteRange> windowReads(const FillWindow& w, uint64_t align) {
  std::vector<ByteRange> needed;
  for (const WindowPiece& p : w.pieces) appendNeeded(p.copy, needed);
  return coalesceReads(std::move(needed), align);
}

std::vector<FillWindow> planWindows(const std::vector<const std::vector<CopyOp>*>& memberOps, uint64_t capacity,
                                    const std::function<uint64_t(uint32_t file, uint64_t from, uint64_t limit)>& cut) {
  std::vector<std::vector<Span>> byFile;
  for (uint32_t m = 0; m < memberOps.size(); ++m) {
    for (const CopyOp& op : *memberOps[m]) {
      if (op.file >= byFile.size()) byFile.resize(op.file + 1);
      byFile[op.file].push_back(Span{m, &op, op.srcOffset, sourceEnd(op)});
    }
  }
  std::vector<FillWindow> out;
  for (uint32_t f = 0; f < byFile.size(); ++f) {
    std::vector<Span>& spans = byFile[f];
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
    size_t next = 0;
    std::vector<const Span*> active;
    while (next < spans.size()) {
      // A region: spans that overlap or touch, read as one stretch of the file.
      uint64_t regionStart = spans[next].start, regionEnd = spans[next].end;
      for (size_t j = next + 1; j < spans.size() && spans[j].start <= regionEnd; ++j) regionEnd = std::max(regionEnd, spans[j].end);
      for (uint64_t ws = regionStart, we; ws < regionEnd; ws = we) {
        we = std::min(regionEnd, ws + capacity);
        if (cut) we = cut(f, ws, we);
        while (next < spans.size() && spans[next].start < we) active.push_back(&spans[next++]);
        active.erase(std::remove_if(active.begin(), active.end(), [&](const Span* s) { return s->end <= ws; }), active.end());
        FillWindow w;
        w.file = f;
        for (const Span* s : active) clip(s->member, *s->op, ws, we, w.pieces);
        if (w.pieces.empty()) continue;  // a gap between the rows of strided ops
        std::stable_sort(w.pieces.begin(), w.pieces.end(), [](const WindowPiece& a, const WindowPiece& b) { return a.member < b.member; });
        w.start = w.pieces.front().copy.srcOffset;
        w.end = 0;
        for (const WindowPiece& p : w.pieces) {
          w.start = std::min(w.start, p.copy.srcOffset);
          w.end = std::max(w.end, p.srcEnd());
        }
        out.push_back(std::move(w));
      }
      active.clear();
    }
  }
  return interleave(std::move(out), memberOps.size());
}

}  // namespace weightd
