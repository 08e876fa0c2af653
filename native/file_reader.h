// Reading checkpoint files for a fill: files opened on demand, a bounded number at once, positional reads that finish or
// fail with a message naming the file, and the split of copy ops into work chunks (which
// reader_threads.h runs).
#pragma once
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device.h"

namespace weightd {

// Opens `path` read-only (O_CLOEXEC | extraFlags) if it is a regular file, symlinks followed,
// and fills `st`. open(2) of a FIFO blocks until a writer appears and a character device reads
// forever, so the open is O_NONBLOCK (no effect on regular files) and the type is checked with
// fstat on the descriptor itself. Throws E_FILE_NOT_REGULAR naming the path and its type, or
// onFailure.code (with its words) when the open fails. The twin of src/checkpoint/openRegularFile.ts.
struct OpenFailure {
  const char* what = "checkpoint file";
  const char* code = "E_FILE_OPEN";
  const char* hint = "check that it exists and is readable by this user";
};
int openRegularFile(const std::string& path, int extraFlags, struct stat& st, const OpenFailure& onFailure = {});

// A file's descriptors, open while anyone holds this.
struct OpenFile {
  int fd = -1;
  // O_DIRECT (reads must be block-aligned), or -1 where the file system refused O_DIRECT or it
  // was not asked for.
  int directFd = -1;
  OpenFile() = default;
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  ~OpenFile();
};

// The checkpoint files of a fill. Every file is checked (type, size) when the set is made, but
// opened only when read, and at most kMaxOpenFiles stay open: a 10,000-shard checkpoint must
// not take 20,000 descriptors. A file closed to make room and opened again must still be the
// regular file of the size it had.
class FileSet {
 public:
  static constexpr size_t kMaxOpenFiles = 64;
  FileSet(const std::vector<std::string>& paths, bool direct);
  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;
  // The file's descriptors, valid while the pointer is held even if the set closes the file for
  // others (for mmap: the cuda backend's register mode maps windows of it).
  std::shared_ptr<const OpenFile> open(uint32_t file) const;
  // Reads exactly `length` bytes at `offset` through the buffered descriptor, retrying short
  // reads; EOF or an error throws.
  void readFull(uint32_t file, void* dst, uint64_t length, uint64_t offset) const;
  uint64_t fileSize(uint32_t file) const { return sizes_[file]; }
  const std::string& path(uint32_t file) const { return paths_[file]; }
  size_t size() const { return paths_.size(); }

 private:
  std::vector<std::string> paths_;
  std::vector<uint64_t> sizes_;
  bool direct_;
  mutable std::mutex mutex_;
  mutable std::vector<std::shared_ptr<const OpenFile>> open_;
  mutable std::list<uint32_t> recent_;  // open files, most recently used first
  mutable std::vector<std::list<uint32_t>::iterator> place_;
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

// Whole rows per chunk of a strided op (splitIntoChunks): as many as `chunkBytes` of its pitch
// hold, at least one. Ranks of one tensor with the same pitch cut it at the same rows.
inline uint64_t rowsPerChunk(const CopyOp& op, uint64_t chunkBytes) {
  return std::max<uint64_t>(1, chunkBytes / std::max<uint64_t>(1, op.srcPitch));
}

class ContentDigests;

// chunkBytes > 0 (the bindings refuse 0). With `digests`, a contiguous op's chunks end where
// ContentDigests::cut says, so that each digest piece lies whole in one chunk.
std::vector<Chunk> splitIntoChunks(const std::vector<CopyOp>& ops, uint64_t chunkBytes, const ContentDigests* digests = nullptr);

// Checks every op against the file sizes and the segment sizes before any byte moves.
void validateOps(const std::vector<CopyOp>& ops, const FileSet& files,
                 const std::vector<uint64_t>& segmentBytes);

std::string errnoMessage(int err);

}  // namespace weightd
