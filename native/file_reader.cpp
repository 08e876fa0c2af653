#include "file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "content_digests.h"

namespace weightd {

std::string errnoMessage(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may not be buf).
  return std::string(strerror_r(err, buf, sizeof buf));
}

namespace {

const char* typeName(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

}  // namespace

int openRegularFile(const std::string& path, int extraFlags, struct stat& st, const OpenFailure& onFailure) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | extraFlags);
  if (fd < 0) {
    int err = errno;
    throw DeviceError(onFailure.code, std::string("cannot open ") + onFailure.what + " " + path + ": " + errnoMessage(err) + "; " + onFailure.hint);
  }
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw DeviceError(onFailure.code, std::string("cannot stat ") + onFailure.what + " " + path + ": " + errnoMessage(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DeviceError("E_FILE_NOT_REGULAR", path + " is " + typeName(st.st_mode) +
                                                ", not a regular file; checkpoint files must be plain files (a symlink to one is fine)");
  }
  return fd;
}

OpenFile::~OpenFile() {
  if (fd >= 0) ::close(fd);
  if (directFd >= 0) ::close(directFd);
}

FileSet::FileSet(const std::vector<std::string>& paths, bool direct)
    : paths_(paths), direct_(direct), open_(paths.size()), place_(paths.size()) {
  for (const auto& p : paths_) {
    struct stat st {};
    ::close(openRegularFile(p, 0, st));
    sizes_.push_back(static_cast<uint64_t>(st.st_size));
  }
}

std::shared_ptr<const OpenFile> FileSet::open(uint32_t file) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_[file]) {
    recent_.splice(recent_.begin(), recent_, place_[file]);
    return open_[file];
  }
  if (recent_.size() >= kMaxOpenFiles) {
    // Readers still holding the evicted file keep its descriptors until they let go.
    open_[recent_.back()].reset();
    recent_.pop_back();
  }
  auto f = std::make_shared<OpenFile>();
  struct stat st {};
  f->fd = openRegularFile(paths_[file], 0, st);
  if (static_cast<uint64_t>(st.st_size) != sizes_[file]) {
    throw DeviceError("E_FILE_CHANGED", "checkpoint file " + paths_[file] + " is " + std::to_string(st.st_size) + " bytes now, " +
                                            std::to_string(sizes_[file]) + " when the load began; was it modified while loading?");
  }
  // Some file systems (tmpfs, overlay on some kernels) refuse O_DIRECT: fall back to the page
  // cache for that file rather than failing the load. The descriptor is checked like the first,
  // since the path could have been swapped in between.
  if (direct_) {
    struct stat dst {};
    try {
      f->directFd = openRegularFile(paths_[file], O_DIRECT, dst);
    } catch (const DeviceError& e) {
      if (e.code() != "E_FILE_OPEN") throw;
    }
    if (f->directFd >= 0 && (dst.st_ino != st.st_ino || dst.st_dev != st.st_dev)) {
      throw DeviceError("E_FILE_CHANGED", "checkpoint file " + paths_[file] + " was replaced while it was being opened; was it modified while loading?");
    }
  }
  recent_.push_front(file);
  place_[file] = recent_.begin();
  open_[file] = f;
  return f;
}

void FileSet::readFull(uint32_t file, void* dst, uint64_t length, uint64_t offset) const {
  std::shared_ptr<const OpenFile> f = open(file);
  auto* out = static_cast<char*>(dst);
  while (length > 0) {
    ssize_t n = ::pread(f->fd, out, length, static_cast<off_t>(offset));
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

std::vector<Chunk> splitIntoChunks(const std::vector<CopyOp>& ops, uint64_t chunkBytes, const ContentDigests* digests) {
  std::vector<Chunk> chunks;
  for (uint32_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (op.rows <= 1) {
      for (uint64_t start = 0, end; start < op.rowBytes; start = end) {
        end = std::min(op.rowBytes, start + chunkBytes);
        if (digests) end = digests->cut(op.file, op.srcOffset + start, op.srcOffset + end) - op.srcOffset;
        chunks.push_back({i, 0, 1, start, end - start});
      }
    } else {
      // Strided regions are cut into whole rows so each chunk is one 2D copy.
      uint64_t perChunk = rowsPerChunk(op, chunkBytes);
      for (uint64_t r = 0; r < op.rows; r += perChunk) {
        uint64_t count = std::min(perChunk, op.rows - r);
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
