#include "content_digests.h"

#include <algorithm>
#include <numeric>

#include "file_reader.h"
#include "reader_threads.h"
#include "xxh3_128.h"


namespace weightd {

ContentDigests::ContentDigests(std::vector<TensorRange> tensors, const FileSet& files) : tensors_(std::move(tensors)) {
  index(files.size(), [&](uint32_t f) { return files.fileSize(f); }, [&](uint32_t f) { return files.path(f); });
}

ContentDigests::ContentDigests(std::vector<TensorRange> tensors, const std::vector<uint64_t>& segmentBytes) : tensors_(std::move(tensors)) {
  index(segmentBytes.size(), [&](uint32_t s) { return segmentBytes[s]; }, [](uint32_t s) { return "segment " + std::to_string(s); });
}

template <typename SizeOf, typename NameOf>
void ContentDigests::index(size_t count, SizeOf sizeOf, NameOf nameOf) {
  tensorFirst_.assign(tensors_.size(), 0);
  fileFirst_.assign(count + 1, 0);
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors_[a].file != tensors_[b].file ? tensors_[a].file < tensors_[b].file : tensors_[a].start < tensors_[b].start;
  });
  for (size_t k = 0; k < order.size(); ++k) {
    const TensorRange& t = tensors_[order[k]];
    std::string where = "tensor range " + std::to_string(order[k]);
    if (t.file >= count) throw DeviceError("E_BAD_PLAN", where + " names file " + std::to_string(t.file) + " of " + std::to_string(count));
    if (t.end < t.start || t.end > sizeOf(t.file)) {
      throw DeviceError("E_BAD_PLAN", where + " [" + std::to_string(t.start) + ", " + std::to_string(t.end) + ") is not inside " + nameOf(t.file) +
                                          " (" + std::to_string(sizeOf(t.file)) + " bytes)");
    }
    if (k > 0 && tensors_[order[k - 1]].file == t.file && tensors_[order[k - 1]].end > t.start) {
      throw DeviceError("E_BAD_PLAN", where + " overlaps tensor range " + std::to_string(order[k - 1]) + " in " + nameOf(t.file));
    }
    tensorFirst_[order[k]] = pieces_.size();
    for (uint64_t s = t.start; s < t.end; s += kPieceBytes) pieces_.push_back({t.file, s, std::min(t.end, s + kPieceBytes)});
  }
  for (const Piece& p : pieces_) ++fileFirst_[p.file + 1];
  std::partial_sum(fileFirst_.begin(), fileFirst_.end(), fileFirst_.begin());
  claimed_ = std::make_unique<std::atomic<bool>[]>(pieces_.size());
  digests_ = std::make_unique<unsigned char[]>(16 * pieces_.size());
}

void ContentDigests::hashPiece(size_t p, const char* data) { xxh3_128(data, pieces_[p].end - pieces_[p].start, &digests_[16 * p]); }

void ContentDigests::hashCovered(uint32_t file, uint64_t start, uint64_t end, const char* data) {
  claimCovered(file, start, end, [&](size_t p) { hashPiece(p, data + (pieces_[p].start - start)); });
}

void ContentDigests::setPieceDigest(size_t piece, const unsigned char* digest) { std::copy(digest, digest + 16, &digests_[16 * piece]); }

uint64_t ContentDigests::cut(uint32_t file, uint64_t from, uint64_t limit) const {
  if (file + 1 >= fileFirst_.size()) return limit;
  auto [first, last] = piecesOf(file);
  // The last piece that starts before `limit`: the one `limit` may cut.
  auto it = std::lower_bound(pieces_.begin() + first, pieces_.begin() + last, limit, [](const Piece& p, uint64_t v) { return p.start < v; });
  if (it == pieces_.begin() + first) return limit;
  const Piece& p = *(it - 1);
  return p.end > limit && p.start > from ? p.start : limit;
}

uint64_t ContentDigests::hashRest(const FileSet& files, unsigned threads, std::atomic<bool>& cancel) {
  std::vector<size_t> rest;
  uint64_t bytes = 0;
  for (size_t p = 0; p < pieces_.size(); ++p) {
    if (claimed_[p].load(std::memory_order_relaxed)) continue;
    rest.push_back(p);
    bytes += pieces_[p].end - pieces_[p].start;
  }
  if (rest.empty()) return 0;
  runOnReaderThreads(rest.size(), threads, cancel, [&](size_t i) {
    const Piece& p = pieces_[rest[i]];
    thread_local std::vector<char> buf;
    if (buf.size() < kPieceBytes) buf.resize(kPieceBytes);
    files.readFull(p.file, buf.data(), p.end - p.start, p.start);
    claimed_[rest[i]] = true;
    hashPiece(rest[i], buf.data());
  });
  return bytes;
}

std::vector<std::string> ContentDigests::tensorDigests() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (size_t t = 0; t < tensors_.size(); ++t) {
    uint64_t n = tensors_[t].end - tensors_[t].start;
    size_t count = static_cast<size_t>((n + kPieceBytes - 1) / kPieceBytes);
    unsigned char digest[16];
    xxh3_128(&digests_[16 * tensorFirst_[t]], 16 * count, digest);
    out.push_back(hexOf(digest, sizeof digest));
  }
  return out;
}

std::vector<std::string> digestFiles(const std::vector<std::string>& files, std::vector<TensorRange> tensors, unsigned threads) {
  FileSet fileSet(files, false);
  ContentDigests digests(std::move(tensors), fileSet);
  std::atomic<bool> cancel{false};
  digests.hashRest(fileSet, threads, cancel);
  return digests.tensorDigests();
}

}  // namespace weightd
