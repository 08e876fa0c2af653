#include "host_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "content_digests.h"
#include "file_reader.h"
#include "host_digest_group.h"
#include "host_memory.h"
#include "read_ranges.h"
#include "reader_threads.h"
#include "sealed_memfd.h"

namespace weightd {

namespace {

// Device ids may come from the user (WEIGHTD_HOST_DEVICES); keep memfd names (shown in
// /proc/PID/fd and /proc/PID/maps) to a safe alphabet.
std::string safeName(const std::string& s) {
  std::string out;
  for (char c : s) out += (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return out.substr(0, 64);
}

std::string gib(uint64_t bytes) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1u << 30));
  return buf;
}

void closeAll(const std::vector<int>& fds) {
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

// Writes all of buf at `offset` of a segment's memfd. Its pages were reserved by fallocate, so
// running short of memory here means the reservation was lost (a cgroup limit lowered meanwhile).
void writeSegment(int fd, uint32_t segment, const char* buf, uint64_t length, uint64_t offset) {
  while (length > 0) {
    ssize_t n = ::pwrite(fd, buf, length, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      throw DeviceError(err == ENOSPC || err == ENOMEM ? "E_OUT_OF_MEMORY" : "E_SHM_WRITE",
                        "cannot write " + std::to_string(length) + " bytes at " + std::to_string(offset) + " of segment " + std::to_string(segment) +
                            ": " + errnoMessage(err) + "; free memory or raise the memory limit");
    }
    buf += n;
    offset += static_cast<uint64_t>(n);
    length -= static_cast<uint64_t>(n);
  }
}

// Threads that reserve or seal a rank's segments at once, at most one per segment: each segment
// is its own memfd, whose pages are made, and checked for pins when sealed, under its own lock.
constexpr unsigned kSegmentThreads = 8;

// The chunks taken from each segment in turn (its own chunks in order): a memfd is written under
// its inode lock, so reader threads that take chunks in arena order all queue on one segment's
// lock at a time, while chunks of several segments are written at once.
std::vector<Chunk> interleaveSegments(std::vector<Chunk> chunks, const std::vector<CopyOp>& ops, size_t segmentCount) {
  if (segmentCount < 2) return chunks;
  std::vector<std::vector<Chunk>> bySegment(segmentCount);
  for (const Chunk& c : chunks) bySegment[ops[c.op].segment].push_back(c);
  std::vector<Chunk> out;
  out.reserve(chunks.size());
  for (size_t k = 0; out.size() < chunks.size(); ++k) {
    for (const auto& own : bySegment) {
      if (k < own.size()) out.push_back(own[k]);
    }
  }
  return out;
}

// A chunk of rows read apart is read whole instead when its span holds digest pieces nobody has
// claimed (content_digests.h): in a node's digest group the first rank to reach a row-parallel
// tensor's chunk reads it whole and hashes it, and the others read their rows. Spans longer than
// this (a rank's rows of a tp=8 tensor) are never buffered whole.
constexpr uint64_t kMaxClaimedSpanBytes = 8ull << 20;

// Packs `rows` rows of `rowBytes` each, found `pitch` apart in `from` starting `column` bytes
// into each, back to back into `to`.
void packRows(char* to, const char* from, uint64_t rows, uint64_t pitch, uint64_t column, uint64_t rowBytes) {
  for (uint64_t r = 0; r < rows; ++r) memcpy(to + r * rowBytes, from + r * pitch + column, rowBytes);
}

// Claims the pieces that lie whole in chunk `c`'s span of `op` into `claimed` (emptied first),
// for the caller to hash once it has read the span; true when it claimed any.
bool claimSpan(ContentDigests& digests, const CopyOp& op, const Chunk& c, std::vector<size_t>& claimed) {
  claimed.clear();
  uint64_t start = op.srcOffset + c.firstRow * op.srcPitch;
  uint64_t bytes = (c.rowCount - 1) * op.srcPitch + op.rowBytes;
  if (bytes > kMaxClaimedSpanBytes) return false;
  digests.claimCovered(op.file, start, start + bytes, [&](size_t p) { claimed.push_back(p); });
  return !claimed.empty();
}

}  // namespace

HostDevice::HostDevice(int index, std::string uuid) : index_(index), uuid_(std::move(uuid)) {}

HostDevice::~HostDevice() { free(); }

DeviceInfo HostDevice::info() {
  DeviceInfo d;
  d.backend = "host";
  d.index = index_;
  d.uuid = uuid_;
  d.name = "host memory (memfd)";
  HostMemory m = hostMemory();
  d.totalBytes = m.totalBytes;
  d.freeBytes = m.freeBytes;
  return d;
}

void HostDevice::allocate(const std::vector<uint64_t>& segmentBytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!segments_.empty()) throw DeviceError("E_ALREADY_ALLOCATED", "device " + uuid_ + " already holds an arena; free it first");
  uint64_t total = 0;
  for (size_t i = 0; i < segmentBytes.size(); ++i) {
    if (segmentBytes[i] == 0) throw DeviceError("E_BAD_PLAN", "segment " + std::to_string(i) + " has zero bytes");
    if (__builtin_add_overflow(total, segmentBytes[i], &total)) throw DeviceError("E_BAD_PLAN", "the segments' sizes overflow 64 bits");
  }
  // Checked before anything is created: fallocate past what memory (or the cgroup) allows may
  // not fail at all but wake the OOM killer, which would pick this process.
  HostMemory memory = hostMemory();
  if (!memory.limitedBy.empty() && total > memory.freeBytes) {
    throw DeviceError("E_OUT_OF_MEMORY", "device " + uuid_ + " needs " + std::to_string(total) + " bytes (" + gib(total) + ") for " +
                                             std::to_string(segmentBytes.size()) + " segment(s) but only " + std::to_string(memory.freeBytes) +
                                             " bytes (" + gib(memory.freeBytes) + ") are free (" + memory.limitedBy +
                                             "); free memory, raise the memory limit, or serve fewer ranks per node");
  }
  try {
    for (size_t i = 0; i < segmentBytes.size(); ++i) {
      Segment seg;
      seg.bytes = segmentBytes[i];
      std::string name = "weightd:" + safeName(uuid_) + ":s" + std::to_string(i);
      seg.fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (seg.fd < 0) {
        int err = errno;
        throw DeviceError("E_SHM_CREATE", "cannot create memfd " + name + ": " + errnoMessage(err) +
                                              (err == EMFILE || err == ENFILE ? "; raise the open-file limit (ulimit -n)" : ""));
      }
      segments_.push_back(seg);
    }
    // fallocate reserves the pages now, so a short memory fails here, before loading, instead
    // of a SIGBUS in the middle of a copy. A memfd's pages are made under its inode lock, one at a
    // time, so the segments are reserved at once, one thread each (two 1 GB files in 0.25 s on 2
    // cores, one 2 GB file in 0.48 s: bench/results/2026-12-05-host-fill-alloc).
    std::atomic<bool> failed{false};
    runOnReaderThreads(segments_.size(), kSegmentThreads, failed, [&](size_t i) {
      const Segment& s = segments_[i];
      if (fallocate(s.fd, 0, 0, static_cast<off_t>(s.bytes)) != 0) {
        int err = errno;
        throw DeviceError("E_OUT_OF_MEMORY", "cannot reserve " + std::to_string(s.bytes) + " bytes (" + gib(s.bytes) + ") for segment " +
                                                 std::to_string(i) + " of device " + uuid_ + ": " + errnoMessage(err) +
                                                 "; free memory or raise the memory limit");
      }
    });
    for (size_t i = 0; i < segments_.size(); ++i) {
      Segment& s = segments_[i];
      // The fill writes through the descriptor (pwrite), not this mapping, which only zero
      // ranges and reads touch: mapping every page here (MAP_POPULATE) zeroed each one and
      // built its page table entry first, 0.9-1.0 s of the 1.6-1.9 s it took to fill 2.27 GB
      // this way on a 2-core VM, where pwrite took 1.30-1.38 s (bench/host/segment-probe.cpp).
      s.base = mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
      if (s.base == MAP_FAILED) {
        s.base = nullptr;
        int err = errno;
        throw DeviceError("E_OUT_OF_MEMORY", "cannot map " + std::to_string(s.bytes) + " bytes of segment " + std::to_string(i) + ": " + errnoMessage(err));
      }
    }
  } catch (...) {
    freeLocked();
    throw;
  }
}

void HostDevice::fill(const std::vector<std::string>& files, const std::vector<CopyOp>& ops,
                      const std::vector<ZeroRange>& zeros, const std::vector<TensorRange>& tensors, const FillOptions& options,
                      FillControl& control) {
  std::vector<uint64_t> sizes;
  std::vector<char*> bases;
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (segments_.empty()) throw DeviceError("E_NOT_ALLOCATED", "fill before allocate on device " + uuid_);
    if (sealed_) {
      throw DeviceError("E_SEALED", "device " + uuid_ + "'s segments are sealed (exported or adopted) and can no longer be written; free and allocate again to fill");
    }
    for (auto& s : segments_) {
      sizes.push_back(s.bytes);
      bases.push_back(static_cast<char*>(s.base));
      fds.push_back(s.fd);
    }
  }
  // The page cache is the fast path for shared memory; O_DIRECT would only add alignment copies.
  // A failure before this rank joins its digest group does not fail the group: the others wait at
  // their end until the node, told of this rank's own error, cancels them. Failing them at once
  // raced that error to the node, which could then name a waiting rank as the one that failed.
  FileSet fileSet(files, false);
  validateOps(ops, fileSet, sizes);
  validateZeroRanges(zeros, sizes);
  // A fresh memfd reads as zeros, but a second fill of the same arena may not: zeroing
  // here keeps one contract for both backends, at the cost of the padding's pages only.
  for (const ZeroRange& z : zeros) memset(bases[z.segment] + z.offset, 0, z.bytes);
  // In a group (the node's other host ranks: host_digest_group.h) the ranks share the hashing.
  std::unique_ptr<DigestGroupMember> member;
  std::unique_ptr<ContentDigests> own;
  if (options.groupSize > 1) {
    member = std::make_unique<DigestGroupMember>(options.groupId, options.groupSize, files, tensors, fileSet);
    member->offerRows(ops, fds, options.chunkBytes);
  } else {
    own = std::make_unique<ContentDigests>(tensors, fileSet);
  }
  ContentDigests& digests = member ? member->digests() : *own;
  std::vector<Chunk> chunks = interleaveSegments(splitIntoChunks(ops, options.chunkBytes, &digests), ops, sizes.size());
  // In a group, the chunks of rows far apart go last: by the time a member reaches them the
  // others have offered theirs (DigestGroupMember::planRows waits for that), so the first to reach
  // one reads it for all, and none idles at the start waiting for a member still allocating.
  if (member) std::stable_partition(chunks.begin(), chunks.end(), [&](const Chunk& c) { return !readsRowsApart(ops[c.op]); });
  runOnReaderThreads(chunks.size(), options.threads, control.cancel, [&](size_t i) {
    const Chunk& c = chunks[i];
    const CopyOp& op = ops[c.op];
    // Each chunk is read into this thread's buffer, its rows packed as they land in the arena,
    // then written into the segment in one pwrite: the kernel makes each page as it is written,
    // as for `cp` into /dev/shm, with no zeroing of a page about to be overwritten.
    thread_local std::vector<char> dense;
    if (dense.size() < c.byteCount) dense.resize(c.byteCount);
    uint64_t dst = op.dstOffset + (op.rows <= 1 ? c.byteStart : c.firstRow * op.rowBytes);
    thread_local std::vector<size_t> claimed;  // the span's pieces claimSpan claimed for this chunk
    claimed.clear();
    RowsPlan rows;
    if (member && readsRowsApart(op)) rows = member->planRows(op, c, control);
    if (rows.kind == RowsPlan::Kind::Skip) {
      // Another member read these rows whole and writes this member's columns (it finishes its
      // copies before the group's digests are done, and so before this fill returns).
      control.bytes += c.byteCount;
      control.rowsReceivedBytes += c.byteCount;
      return;
    }
    if (rows.kind == RowsPlan::Kind::Deliver) {
      // The chunk's rows read whole once, hashed while in the CPU's cache, this member's columns
      // packed for its own write below and every other member's written into its arena here.
      thread_local std::vector<char> whole;
      thread_local std::vector<char> theirs;
      if (whole.size() < rows.spanBytes) whole.resize(rows.spanBytes);
      fileSet.readFull(op.file, whole.data(), rows.spanBytes, rows.spanStart);
      digests.hashCovered(op.file, rows.spanStart, rows.spanStart + rows.spanBytes, whole.data());
      packRows(dense.data(), whole.data(), c.rowCount, op.srcPitch, rows.colOffset, op.rowBytes);
      for (const RowsPlan::Dest& d : rows.dests) {
        uint64_t n = c.rowCount * d.rowBytes;
        if (theirs.size() < n) theirs.resize(n);
        packRows(theirs.data(), whole.data(), c.rowCount, op.srcPitch, d.colOffset, d.rowBytes);
        try {
          writeSegment(d.fd, d.segment, theirs.data(), n, d.dst);
        } catch (const DeviceError& e) {
          // The segment is another rank's, written here for it: say so, or the node would blame this rank's own arena.
          throw DeviceError(e.code(), std::string("writing another rank's rows into its arena for it (digest group " + options.groupId + "): ") + e.what());
        }
        control.rowsDeliveredBytes += n;
      }
    } else if (op.rows <= 1) {
      // Read a digest piece at a time and hash it at once, while it is still in the CPU's cache.
      for (uint64_t at = 0, end; at < c.byteCount; at = end) {
        uint64_t from = op.srcOffset + c.byteStart;
        end = digests.cut(op.file, from + at, from + std::min(c.byteCount, at + ContentDigests::kPieceBytes)) - from;
        fileSet.readFull(op.file, dense.data() + at, end - at, from + at);
        digests.hashCovered(op.file, from + at, from + end, dense.data() + at);
      }
    } else if (readsRowsApart(op) && !claimSpan(digests, op, c, claimed)) {
      // The gaps are worth skipping (read_ranges.h), and another rank reads this span whole (or it
      // holds no piece, or is too long to buffer): one read per row. A row holds no whole digest
      // piece unless it is at least a piece long; hashRest reads the others.
      for (uint64_t r = 0; r < c.rowCount; ++r) {
        uint64_t from = op.srcOffset + (c.firstRow + r) * op.srcPitch;
        fileSet.readFull(op.file, dense.data() + r * op.rowBytes, op.rowBytes, from);
        if (op.rowBytes >= ContentDigests::kPieceBytes) digests.hashCovered(op.file, from, from + op.rowBytes, dense.data() + r * op.rowBytes);
      }
    } else {
      // Rows this close together are read as one span, then packed: a read per row would cost
      // more than the few bytes between them. So are rows far apart whose span holds digest pieces
      // nobody has claimed (claimSpan): read whole here, its pieces are hashed in the CPU's cache,
      // where the ranks' rows alone would leave them all to hashRest's second read.
      thread_local std::vector<char> span;
      uint64_t spanBytes = (c.rowCount - 1) * op.srcPitch + op.rowBytes;
      if (span.size() < spanBytes) span.resize(spanBytes);
      uint64_t spanStart = op.srcOffset + c.firstRow * op.srcPitch;
      fileSet.readFull(op.file, span.data(), spanBytes, spanStart);
      for (size_t p : claimed) digests.hashClaimed(p, span.data() + (digests.pieceStart(p) - spanStart));
      digests.hashCovered(op.file, spanStart, spanStart + spanBytes, span.data());
      packRows(dense.data(), span.data(), c.rowCount, op.srcPitch, 0, op.rowBytes);
    }
    writeSegment(fds[op.segment], op.segment, dense.data(), c.byteCount, dst);
    control.bytes += c.byteCount;
  });
  if (member) {
    member->finish(fileSet, options.threads, control);
    return;
  }
  control.digestRereadBytes = digests.hashRest(fileSet, options.threads, control.cancel);
  control.digests = digests.tensorDigests();
}

std::vector<SegmentExport> HostDevice::exportSegments() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (segments_.empty()) throw DeviceError("E_NOT_ALLOCATED", "export before allocate on device " + uuid_);
  if (!sealed_) sealLocked();
  std::vector<SegmentExport> out;
  for (uint32_t i = 0; i < segments_.size(); ++i) out.push_back({i, segments_[i].bytes, "memfd", segments_[i].fd});
  return out;
}

// F_SEAL_WRITE is refused (EBUSY) while any shared mapping that may write exists, and a
// read-write memfd's shared mapping may, whatever its protection (VM_MAYWRITE): the fill's
// mapping goes, the seals go on, and only then a read-only mapping comes back. A failure half way
// leaves no arena: the device frees it rather than serve segments of which some are writable.
// The seal itself walks every page of the file for pins (about 11 ms per GB on the development
// VM, on the path to READY), and each segment is its own file: they are sealed on several threads.
void HostDevice::sealLocked() {
  try {
    std::atomic<bool> failed{false};
    runOnReaderThreads(segments_.size(), kSegmentThreads, failed, [this](size_t i) {
      Segment& s = segments_[i];
      munmap(s.base, s.bytes);
      s.base = nullptr;
      if (int err = addSealsWaitingForPins(s.fd, kServedSeals | F_SEAL_SEAL); err != 0) {
        throw DeviceError("E_SHM_SEAL", "cannot seal segment " + std::to_string(i) + " of device " + uuid_ + ": " + errnoMessage(err) +
                                            (err == EBUSY ? "; its pages were still held by another process or the kernel after " +
                                                                std::to_string(kSealPinWaitMs / 1000) + " s (a splice into a pipe, I/O in flight); end that, then start again"
                                                          : ""));
      }
      void* base = mapSealedReadOnly(s.fd, s.bytes);
      if (base == MAP_FAILED) {
        int err = errno;
        throw DeviceError("E_SHM_MAP", "cannot map segment " + std::to_string(i) + " of device " + uuid_ + " read-only: " + errnoMessage(err));
      }
      s.base = base;
    });
  } catch (...) {
    freeLocked();
    throw;
  }
  sealed_ = true;
}

void HostDevice::adopt(const std::vector<int>& fds, const std::vector<uint64_t>& segmentBytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Segment> adopted;
  try {
    if (!segments_.empty()) throw DeviceError("E_ALREADY_ALLOCATED", "device " + uuid_ + " already holds an arena; free it before adopting one");
    if (fds.size() != segmentBytes.size()) {
      throw DeviceError("E_BAD_SEGMENT_FD", "adopt got " + std::to_string(fds.size()) + " descriptor(s) for " + std::to_string(segmentBytes.size()) +
                                                " segment(s) on device " + uuid_ + "; pass one per segment, in segment order");
    }
    if (fds.empty()) throw DeviceError("E_BAD_PLAN", "adopt needs at least one segment");
    for (size_t i = 0; i < fds.size(); ++i) {
      std::string which = "segment " + std::to_string(i) + " (fd " + std::to_string(fds[i]) + ")";
      if (segmentBytes[i] == 0) throw DeviceError("E_BAD_PLAN", which + " has zero bytes");
      std::string unsealed = servedSealsMissing(fds[i]);
      if (!unsealed.empty()) throw DeviceError("E_BAD_SEGMENT_FD", which + " is " + unsealed + "; only segments a daemon exported can be adopted");
      struct stat st {};
      if (fstat(fds[i], &st) != 0 || static_cast<uint64_t>(st.st_size) < segmentBytes[i]) {
        throw DeviceError("E_BAD_SEGMENT_FD", which + " holds " + std::to_string(st.st_size) + " bytes, fewer than the " +
                                                  std::to_string(segmentBytes[i]) + " its plan needs");
      }
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      void* base = mapSealedReadOnly(fds[i], segmentBytes[i]);
      if (base == MAP_FAILED) {
        int err = errno;
        throw DeviceError("E_SHM_MAP", "cannot map adopted segment " + std::to_string(i) + " (fd " + std::to_string(fds[i]) + "): " + errnoMessage(err));
      }
      adopted.push_back({fds[i], base, segmentBytes[i]});
    }
  } catch (...) {
    for (Segment& s : adopted) munmap(s.base, s.bytes);
    closeAll(fds);
    throw;
  }
  segments_ = std::move(adopted);
  sealed_ = true;
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

// Clients that still map a segment (or hold its descriptor) keep its pages; the memory goes
// when the last of them lets go.
void HostDevice::freeLocked() {
  for (auto& s : segments_) {
    if (s.base) munmap(s.base, s.bytes);
    if (s.fd >= 0) ::close(s.fd);
  }
  segments_.clear();
  sealed_ = false;
}

}  // namespace weightd
