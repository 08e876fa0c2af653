// The full-content digests of a fill (docs/spec/fingerprint.md, version 3, "Tensor digests"):
// each tensor's bytes are cut into pieces of kPieceBytes from its first byte, each piece is
// hashed with xxh3-128, and the tensor's digest is the xxh3-128 of its pieces' digests.
//
// Pieces make the digest parallel: reader threads hash every piece that lies whole inside what
// they have just read (hashCovered), in any order, while the bytes are still in the CPU cache,
// and the fill cuts its work at piece boundaries (cut) so that almost every piece lies whole in
// one read. What no read covered whole (a piece split between two ranks' slices, the rows of a
// row-parallel slice, a tensor the fill does not copy at all) is read again and hashed at the
// end (hashRest), so the digests always cover every byte of every tensor listed.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fill_records.h"

namespace weightd {

class FileSet;

class ContentDigests {
 public:
  static constexpr uint64_t kPieceBytes = 1ull << 20;

  // `tensors` index `files`' list; checked here: E_BAD_PLAN for a tensor outside its file or
  // overlapping another.
  ContentDigests(std::vector<TensorRange> tensors, const FileSet& files);
  // The same over a device's segments of `segmentBytes` (a written cuda version's, hashed from
  // device memory: cuda_update_segments.h), which are not files.
  ContentDigests(std::vector<TensorRange> tensors, const std::vector<uint64_t>& segmentBytes);
  ContentDigests(const ContentDigests&) = delete;
  ContentDigests& operator=(const ContentDigests&) = delete;

  bool empty() const { return tensors_.empty(); }
  // Hashes each piece that lies whole inside bytes [start, end) of `file`, found at `data`, and
  // that no thread has claimed yet. Safe from several threads at once.
  void hashCovered(uint32_t file, uint64_t start, uint64_t end, const char* data);
  // Claims each piece that lies whole inside bytes [start, end) of `file` and that nobody has
  // claimed yet, and calls `claimed(piece)` for it: whoever claims a piece hashes it (once), here
  // or elsewhere (the GPU, cuda_digests.h), and gives its digest to setPieceDigest.
  template <typename Claimed>
  void claimCovered(uint32_t file, uint64_t start, uint64_t end, Claimed claimed);
  // Hashes a piece the caller claimed (claimCovered), from its bytes at `data`.
  void hashClaimed(size_t piece, const char* data) { hashPiece(piece, data); }
  uint64_t pieceStart(size_t piece) const { return pieces_[piece].start; }
  uint64_t pieceBytes(size_t piece) const { return pieces_[piece].end - pieces_[piece].start; }
  // Its 16 canonical bytes, for a piece hashed elsewhere. Before tensorDigests.
  void setPieceDigest(size_t piece, const unsigned char* digest);
  // Gives a claimed piece back, for whoever covers it next (hashCovered, at the latest hashRest).
  void release(size_t piece) { claimed_[piece].store(false, std::memory_order_relaxed); }
  // Where work that starts at `from` and may run to `limit` should end: at the start of the piece
  // that `limit` cuts in two, when that start is past `from`; else `limit`.
  uint64_t cut(uint32_t file, uint64_t from, uint64_t limit) const;
  // Reads and hashes every piece no read covered, on up to `threads` threads; returns the bytes
  // it read (FillControl::digestRereadBytes).
  uint64_t hashRest(const FileSet& files, unsigned threads, std::atomic<bool>& cancel);
  // Each tensor's digest, 32 lowercase hex digits, in the order the tensors were given. Only
  // after hashRest.
  std::vector<std::string> tensorDigests() const;

 private:
  struct Piece {
    uint32_t file;
    uint64_t start;
    uint64_t end;
  };
  // The pieces of `file`: [first, last) of pieces_.
  std::pair<size_t, size_t> piecesOf(uint32_t file) const { return {fileFirst_[file], fileFirst_[file + 1]}; }
  void hashPiece(size_t p, const char* data);
  // Checks the tensors against `count` files (or segments) of sizeOf(i) bytes, named by nameOf(i)
  // in errors, and cuts them into pieces.
  template <typename SizeOf, typename NameOf>
  void index(size_t count, SizeOf sizeOf, NameOf nameOf);

  std::vector<TensorRange> tensors_;
  std::vector<size_t> tensorFirst_;  // per tensor, its first piece: a tensor's pieces are consecutive
  std::vector<Piece> pieces_;        // ascending by (file, start)
  std::vector<size_t> fileFirst_;    // per file, its first piece; one more entry at the end
  std::unique_ptr<std::atomic<bool>[]> claimed_;
  std::unique_ptr<unsigned char[]> digests_;  // 16 canonical bytes per piece
};

template <typename Claimed>
void ContentDigests::claimCovered(uint32_t file, uint64_t start, uint64_t end, Claimed claimed) {
  if (file + 1 >= fileFirst_.size()) return;
  auto [first, last] = piecesOf(file);
  auto it = std::lower_bound(pieces_.begin() + first, pieces_.begin() + last, start, [](const Piece& p, uint64_t v) { return p.start < v; });
  for (size_t p = it - pieces_.begin(); p < last && pieces_[p].end <= end; ++p) {
    // Each piece is claimed once; replicated bytes read for several GPUs or ranks are not hashed again.
    if (!claimed_[p].exchange(true, std::memory_order_relaxed)) claimed(p);
  }
}

// The digests of `tensors` (indexing `files`) read from disk alone, through the page cache, on up
// to `threads` threads: what a fill of them would report (weightd verify).
std::vector<std::string> digestFiles(const std::vector<std::string>& files, std::vector<TensorRange> tensors, unsigned threads);

}  // namespace weightd
