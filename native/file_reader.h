// Reading checkpoint files for a fill: every file opened once, positional reads that finish or
// fail with a message naming the file, and the split of copy ops into work chunks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "device.h"

namespace weightd {

class FileSet {
 public:
  FileSet(const std::vector<std::string>& paths, bool direct);
  ~FileSet();
  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;
  // Reads exactly `length` bytes at `offset`, retrying short reads; EOF or an error throws.
  void readFull(uint32_t file, void* dst, uint64_t length, uint64_t offset) const;
  // The file's O_DIRECT descriptor (reads must be block-aligned), or -1 where the file system
  // refused O_DIRECT or it was not asked for. readFull always uses the buffered descriptor.
  int directFd(uint32_t file) const { return directFds_[file]; }
  // The buffered descriptor (for mmap: the cuda backend's register mode maps windows of it).
  int fd(uint32_t file) const { return fds_[file]; }
  uint64_t fileSize(uint32_t file) const { return sizes_[file]; }
  const std::string& path(uint32_t file) const { return paths_[file]; }
  size_t size() const { return fds_.size(); }

 private:
  std::vector<std::string> paths_;
  std::vector<int> fds_;
  std::vector<int> directFds_;
  std::vector<uint64_t> sizes_;
};

// A piece of one op: rows [firstRow, firstRow + rowCount), or, for a single-row op, the byte
// range [byteStart, byteStart + byteCount) of that row. Chunks are what reader threads take.
struct Chunk {
  uint32_t op = 0;
  uint64_t firstRow = 0;
  uint64_t rowCount = 1;
  uint64_t byteStart = 0;
  uint64_t byteCount = 0;
};

std::vector<Chunk> splitIntoChunks(const std::vector<CopyOp>& ops, uint64_t chunkBytes);

// Checks every op against the file sizes and the segment sizes before any byte moves.
void validateOps(const std::vector<CopyOp>& ops, const FileSet& files,
                 const std::vector<uint64_t>& segmentBytes);

// Runs `work(chunkIndex)` on `threads` threads until every chunk is done, an error is thrown
// (the first one is rethrown here after all threads stop) or progress.cancel is set.
template <typename Work>
void runChunks(size_t chunkCount, unsigned threads, FillProgress& progress, Work work);

std::string errnoMessage(int err);

}  // namespace weightd

#include "file_reader_inl.h"
