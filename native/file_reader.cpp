#include "file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace weightd {

std::string errnoMessage(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may not be buf).
  return std::string(strerror_r(err, buf, sizeof buf));
}

FileSet::FileSet(const std::vector<std::string>& paths, bool direct) : paths_(paths) {
  try {
    for (const auto& p : paths_) {
      int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        int err = errno;
        throw DeviceError("E_FILE_OPEN", "cannot open checkpoint file " + p + ": " + errnoMessage(err) +
                                             "; check that it exists and is readable by this user");
      }
      fds_.push_back(fd);
      struct stat st {};
      if (fstat(fd, &st) != 0) {
        int err = errno;
        throw DeviceError("E_FILE_OPEN", "cannot stat checkpoint file " + p + ": " + errnoMessage(err));
      }
      sizes_.push_back(static_cast<uint64_t>(st.st_size));
      int dfd = -1;
      // Some file systems (tmpfs, overlay on some kernels) refuse O_DIRECT: fall back to the
      // page cache for that file rather than failing the load.
      if (direct) dfd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      directFds_.push_back(dfd);
    }
  } catch (...) {
    for (int fd : fds_) ::close(fd);
    for (int fd : directFds_) if (fd >= 0) ::close(fd);
    throw;
  }
}

FileSet::~FileSet() {
  for (int fd : fds_) ::close(fd);
  for (int fd : directFds_) if (fd >= 0) ::close(fd);
}

void FileSet::readFull(uint32_t file, void* dst, uint64_t length, uint64_t offset) const {
  auto* out = static_cast<char*>(dst);
  while (length > 0) {
    ssize_t n = ::pread(fds_[file], out, length, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      throw DeviceError("E_FILE_READ", "read of " + paths_[file] + " at byte " + std::to_string(offset) +
                                           " failed: " + errnoMessage(err));
    }
    if (n == 0) {
      throw DeviceError("E_FILE_TRUNCATED", "checkpoint file " + paths_[file] + " ended at byte " +
                                                std::to_string(offset) + " while " + std::to_string(length) +
                                                " more bytes were expected; was it modified while loading?");
    }
    out += n;
    offset += static_cast<uint64_t>(n);
    length -= static_cast<uint64_t>(n);
  }
}

std::vector<Chunk> splitIntoChunks(const std::vector<CopyOp>& ops, uint64_t chunkBytes) {
  if (chunkBytes == 0) chunkBytes = 16ull << 20;
  std::vector<Chunk> chunks;
  for (uint32_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (op.rows <= 1) {
      for (uint64_t start = 0; start < op.rowBytes; start += chunkBytes) {
        chunks.push_back({i, 0, 1, start, std::min(chunkBytes, op.rowBytes - start)});
      }
    } else {
      // Strided regions are cut into whole rows so each chunk is one 2D copy.
      uint64_t rowsPerChunk = std::max<uint64_t>(1, chunkBytes / std::max<uint64_t>(1, op.srcPitch));
      for (uint64_t r = 0; r < op.rows; r += rowsPerChunk) {
        uint64_t count = std::min(rowsPerChunk, op.rows - r);
        chunks.push_back({i, r, count, 0, count * op.rowBytes});
      }
    }
  }
  return chunks;
}

static bool addOverflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_add_overflow(a, b, &out); }
static bool mulOverflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

void validateOps(const std::vector<CopyOp>& ops, const FileSet& files, const std::vector<uint64_t>& segmentBytes) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    std::string where = "copy op " + std::to_string(i);
    if (op.file >= files.size()) throw DeviceError("E_BAD_PLAN", where + " names file " + std::to_string(op.file) + " of " + std::to_string(files.size()));
    if (op.segment >= segmentBytes.size()) throw DeviceError("E_BAD_PLAN", where + " names segment " + std::to_string(op.segment) + " of " + std::to_string(segmentBytes.size()));
    if (op.rows == 0 || op.rowBytes == 0) throw DeviceError("E_BAD_PLAN", where + " copies no bytes");
    if (op.rows > 1 && op.srcPitch < op.rowBytes) throw DeviceError("E_BAD_PLAN", where + " has a row pitch smaller than its row");
    uint64_t srcSpan, srcEnd, dstSpan, dstEnd;
    if (mulOverflows(op.rows - 1, op.srcPitch, srcSpan) || addOverflows(srcSpan, op.rowBytes, srcSpan) ||
        addOverflows(op.srcOffset, srcSpan, srcEnd) || srcEnd > files.fileSize(op.file)) {
      throw DeviceError("E_BAD_PLAN", where + " reads past the end of " + files.path(op.file) + " (" +
                                          std::to_string(files.fileSize(op.file)) + " bytes); was the file changed after planning?");
    }
    if (mulOverflows(op.rows, op.rowBytes, dstSpan) || addOverflows(op.dstOffset, dstSpan, dstEnd) ||
        dstEnd > segmentBytes[op.segment]) {
      throw DeviceError("E_BAD_PLAN", where + " writes past the end of segment " + std::to_string(op.segment));
    }
  }
}

}  // namespace weightd
