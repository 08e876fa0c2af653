#include "host_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "file_reader.h"
#include "reader_threads.h"

namespace weightd {

namespace {

std::string randomHex() {
  std::random_device rd;
  char buf[17];
  snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

// Device ids may come from the user (WEIGHTD_HOST_DEVICES); keep file names to a safe alphabet.
std::string safeName(const std::string& s) {
  std::string out;
  for (char c : s) out += (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return out.substr(0, 64);
}

// The inode of this process's pid namespace ("0" where /proc cannot say). A pid means nothing
// outside its namespace: the sweep of stale segments only trusts pids of its own namespace.
std::string pidNamespaceId() {
  char link[64] = {0};
  ssize_t n = readlink("/proc/self/ns/pid", link, sizeof link - 1);  // "pid:[4026531836]"
  std::string id;
  for (ssize_t i = 0; i < n; ++i) {
    if (isdigit(static_cast<unsigned char>(link[i]))) id += link[i];
  }
  return id.empty() ? "0" : id;
}

}  // namespace

HostDevice::HostDevice(int index, std::string uuid, std::string shmDir)
    : index_(index), uuid_(std::move(uuid)), shmDir_(std::move(shmDir)) {}

HostDevice::~HostDevice() { free(); }

DeviceInfo HostDevice::info() {
  DeviceInfo d;
  d.backend = "host";
  d.index = index_;
  d.uuid = uuid_;
  d.name = "host shared memory (" + shmDir_ + ")";
  struct statvfs vfs {};
  if (statvfs(shmDir_.c_str(), &vfs) == 0) {
    d.totalBytes = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
    d.freeBytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  return d;
}

void HostDevice::allocate(const std::vector<uint64_t>& segmentBytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!segments_.empty()) throw DeviceError("E_ALREADY_ALLOCATED", "device " + uuid_ + " already holds an arena; free it first");
  try {
    // The pid (and its namespace) in the name let a later daemon remove files a killed one left
    // behind: src/native/sweepStaleSegments.ts.
    std::string stem = shmDir_ + "/weightd-" + std::to_string(getpid()) + "-" + pidNamespaceId() + "-" + safeName(uuid_) + "-" +
                       randomHex();
    for (size_t i = 0; i < segmentBytes.size(); ++i) {
      Segment seg;
      seg.bytes = segmentBytes[i];
      seg.path = stem + "-s" + std::to_string(i);
      // O_EXCL + O_NOFOLLOW: never reuse or follow something another user placed there.
      seg.fd = ::open(seg.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (seg.fd < 0) {
        int err = errno;
        throw DeviceError("E_SHM_CREATE", "cannot create shared-memory file " + seg.path + ": " + errnoMessage(err) +
                                              "; check that " + shmDir_ + " exists and is writable");
      }
      segments_.push_back(seg);
      Segment& s = segments_.back();
      // umask can only narrow 0600, but a umask of 0 with another default would widen it.
      fchmod(s.fd, 0600);
      if (s.bytes == 0) throw DeviceError("E_BAD_PLAN", "segment " + std::to_string(i) + " has zero bytes");
      // posix_fallocate reserves the pages now, so a short /dev/shm fails here, before loading,
      // instead of a SIGBUS in the middle of a copy.
      int rc = posix_fallocate(s.fd, 0, static_cast<off_t>(s.bytes));
      if (rc != 0) {
        throw DeviceError("E_OUT_OF_MEMORY", "cannot reserve " + std::to_string(s.bytes) + " bytes in " + shmDir_ + ": " +
                                                 errnoMessage(rc) + "; free shared memory or enlarge " + shmDir_ + " (for Docker, --shm-size)");
      }
      // MAP_POPULATE maps every page now: faulting them in one by one from the reader threads
      // serialises on the mm lock and cut the fill to a tenth of the read speed.
      s.base = mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, s.fd, 0);
      if (s.base == MAP_FAILED) {
        s.base = nullptr;
        int err = errno;
        throw DeviceError("E_OUT_OF_MEMORY", "cannot map " + seg.path + ": " + errnoMessage(err));
      }
    }
  } catch (...) {
    freeLocked();
    throw;
  }
}

void HostDevice::fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
                      const std::vector<ZeroRange>& zeros, const FillOptions& options, FillControl& control) {
  std::vector<uint64_t> sizes;
  std::vector<char*> bases;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (segments_.empty()) throw DeviceError("E_NOT_ALLOCATED", "fill before allocate on device " + uuid_);
    for (auto& s : segments_) {
      sizes.push_back(s.bytes);
      bases.push_back(static_cast<char*>(s.base));
    }
  }
  // The page cache is the fast path for shared memory; O_DIRECT would only add alignment copies.
  FileSet fileSet(files, false);
  validateOps(ops, fileSet, sizes);
  validateZeroRanges(zeros, sizes);
  // A fresh segment file reads as zeros, but a second fill of the same arena may not: zeroing
  // here keeps one contract for both backends, at the cost of the padding's pages only.
  for (const ZeroRange& z : zeros) memset(bases[z.segment] + z.offset, 0, z.bytes);
  std::vector<Chunk> chunks = splitIntoChunks(ops, options.chunkBytes);
  runOnReaderThreads(chunks.size(), options.threads, control.cancel, [&](size_t i) {
    const Chunk& c = chunks[i];
    const CopyOp& op = ops[c.op];
    char* dst = bases[op.segment] + op.dstOffset;
    if (op.rows <= 1) {
      fileSet.readFull(op.file, dst + c.byteStart, c.byteCount, op.srcOffset + c.byteStart);
    } else {
      // One read of the rows' whole source span, then a copy per row: a row-parallel slice
      // has thousands of short rows, and a pread each costs far more than the bytes skipped.
      thread_local std::vector<char> span;
      uint64_t spanBytes = (c.rowCount - 1) * op.srcPitch + op.rowBytes;
      if (span.size() < spanBytes) span.resize(spanBytes);
      fileSet.readFull(op.file, span.data(), spanBytes, op.srcOffset + c.firstRow * op.srcPitch);
      for (uint64_t r = 0; r < c.rowCount; ++r) {
        memcpy(dst + (c.firstRow + r) * op.rowBytes, span.data() + r * op.srcPitch, op.rowBytes);
      }
    }
    control.bytes += c.byteCount;
  });
}

std::vector<SegmentExport> HostDevice::exportSegments() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (segments_.empty()) throw DeviceError("E_NOT_ALLOCATED", "export before allocate on device " + uuid_);
  std::vector<SegmentExport> out;
  for (uint32_t i = 0; i < segments_.size(); ++i) out.push_back({i, segments_[i].bytes, segments_[i].path});
  return out;
}

void HostDevice::read(uint32_t segment, uint64_t offset, uint64_t length, void* dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  checkReadRange(segments_, segment, offset, length);
  memcpy(dst, static_cast<char*>(segments_[segment].base) + offset, length);
}

void HostDevice::free() {
  std::lock_guard<std::mutex> lock(mutex_);
  freeLocked();
}

void HostDevice::freeLocked() {
  for (auto& s : segments_) {
    if (s.base) munmap(s.base, s.bytes);
    if (s.fd >= 0) ::close(s.fd);
    // Clients that still map the file keep their pages; the name goes now so nothing new can.
    if (!s.path.empty()) ::unlink(s.path.c_str());
  }
  segments_.clear();
}

}  // namespace weightd
