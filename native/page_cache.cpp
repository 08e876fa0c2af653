#include "page_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "file_reader.h"

namespace weightd {

namespace {

constexpr uint64_t kSampleBytes = 1ull << 20;
constexpr uint64_t kSampleStride = 64ull << 20;

}  // namespace

Residency pageCacheResidency(const std::vector<std::string>& paths) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  FileSet files(paths, false);
  Residency r;
  std::vector<unsigned char> pages;
  for (uint32_t f = 0; f < files.size(); ++f) {
    const uint64_t size = files.fileSize(f);
    r.totalBytes += size;
    // A file of up to one stride is scanned whole; a larger one a window at the middle of each
    // stride (page-aligned), the last stride's included however short it is.
    const bool whole = size <= kSampleStride;
    for (uint64_t base = 0; base < size; base += kSampleStride) {
      const uint64_t span = std::min(kSampleStride, size - base);
      const uint64_t length = whole ? span : std::min(kSampleBytes, span);
      const uint64_t at = (base + (span - length) / 2) / page * page;
      void* p = mmap(nullptr, length, PROT_READ, MAP_SHARED, files.open(f)->fd, static_cast<off_t>(at));
      if (p == MAP_FAILED) {
        int err = errno;
        throw DeviceError("E_FILE_READ", "cannot map " + files.path(f) + " to see what the page cache holds: " + errnoMessage(err));
      }
      pages.assign((length + page - 1) / page, 0);
      int rc = mincore(p, length, pages.data());
      int err = errno;
      munmap(p, length);
      if (rc != 0) throw DeviceError("E_FILE_READ", "mincore of " + files.path(f) + " failed: " + errnoMessage(err));
      r.sampledBytes += length;
      for (size_t i = 0; i < pages.size(); ++i) {
        if (pages[i] & 1) r.residentBytes += std::min(page, length - i * page);
      }
    }
  }
  return r;
}

}  // namespace weightd
