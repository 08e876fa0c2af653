// Measures ways of filling a host segment (a memfd, as native/host_device.cpp makes them) from
// files in a warm page cache, outside the daemon, to see where the host backend's time goes:
// making the pages, mapping them, or copying into them.
//
//   segment-probe --files a,b,... --mode M --threads T [--chunk-mib 2 | --chunk-kib K] [--reps 3]
//
// Modes (every one ends with the segment holding the files' bytes, back to back):
//   populate:   fallocate, mmap(MAP_POPULATE) on one thread, then T threads pread into the mapping
//               (the daemon's design on 2026-12-01);
//   populate-T: fallocate, then T threads each MADV_POPULATE_WRITE their share of the mapping,
//               then T threads pread into it;
//   fault:      fallocate and a plain mmap; the reading threads fault the pages in as they write;
//   pwrite:     fallocate, then T threads pread a chunk into their own buffer and pwrite it into
//               the memfd (what cp does: the kernel makes each page as it is written, with no
//               page table of ours and no zeroing of pages about to be overwritten);
//   pwrite-nofalloc: the same without fallocate.
//   falloc-ahead: no fallocate up front: one more thread fallocates the segment chunk by chunk,
//               and a reader waits before its pwrite until its chunk's pages are reserved;
//   populate-chunk: no fallocate: each reader makes its chunk's pages (MADV_POPULATE_WRITE,
//               which fails with ENOMEM where a write would SIGBUS), then preads into the mapping;
//   fault-nofalloc: no fallocate, a plain mapping; the readers fault the pages in (a SIGBUS when
//               memory is short: a reference, not a design).
// Prints one JSON line per rep: the mode, seconds for the segment's creation and for the copy,
// and GB/s over the whole.
//
// Build: g++ -O2 -std=c++17 -o /tmp/segment-probe bench/host/segment-probe.cpp -lpthread
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {

// This process's CPU time (user + system, every thread), in seconds.
double cpuSeconds() {
  rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void die(const char* what) {
  perror(what);
  exit(1);
}

struct Chunk {
  int fd;
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
};

template <typename F>
void onThreads(unsigned n, F f) {
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < n; ++t) ts.emplace_back(f, t);
  for (auto& t : ts) t.join();
}

void readFull(int fd, char* dst, uint64_t n, uint64_t off) {
  while (n) {
    ssize_t r = pread(fd, dst, n, off);
    if (r <= 0) die("pread");
    dst += r, off += r, n -= r;
  }
}

void writeFull(int fd, const char* src, uint64_t n, uint64_t off) {
  while (n) {
    ssize_t r = pwrite(fd, src, n, off);
    if (r <= 0) die("pwrite");
    src += r, off += r, n -= r;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  std::string mode = "populate";
  unsigned threads = 8;
  uint64_t chunk = 2ull << 20;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--files") {
      for (size_t a = 0, b; a <= v.size(); a = b + 1) {
        b = v.find(',', a);
        if (b == std::string::npos) b = v.size();
        files.push_back(v.substr(a, b - a));
      }
    } else if (k == "--mode") mode = v;
    else if (k == "--threads") threads = std::stoul(v);
    else if (k == "--chunk-mib") chunk = std::stoull(v) << 20;
    else if (k == "--chunk-kib") chunk = std::stoull(v) << 10;
    else if (k == "--reps") reps = std::stoi(v);
  }
  std::vector<Chunk> chunks;
  uint64_t total = 0;
  for (auto& f : files) {
    int fd = open(f.c_str(), O_RDONLY);
    if (fd < 0) die(f.c_str());
    struct stat st {};
    fstat(fd, &st);
    for (uint64_t o = 0; o < static_cast<uint64_t>(st.st_size); o += chunk) {
      uint64_t n = std::min<uint64_t>(chunk, st.st_size - o);
      chunks.push_back({fd, o, total + o, n});
    }
    total += st.st_size;
  }
  for (int rep = 0; rep < reps; ++rep) {
    double t0 = now(), cpu0 = cpuSeconds();
    int seg = memfd_create("segment-probe", MFD_CLOEXEC);
    if (seg < 0) die("memfd_create");
    bool falloc = mode == "populate" || mode == "populate-T" || mode == "fault" || mode == "pwrite";
    if (falloc && fallocate(seg, 0, 0, total) != 0) die("fallocate");
    if (!falloc && ftruncate(seg, total) != 0) die("ftruncate");
    char* base = nullptr;
    bool mapped = mode == "populate" || mode == "populate-T" || mode == "fault" || mode == "populate-chunk" || mode == "fault-nofalloc";
    if (mapped) {
      void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | (mode == "populate" ? MAP_POPULATE : 0), seg, 0);
      if (p == MAP_FAILED) die("mmap");
      base = static_cast<char*>(p);
    }
    if (mode == "populate-T") {
      uint64_t per = (total / threads + 4095) / 4096 * 4096;
      onThreads(threads, [&](unsigned t) {
        uint64_t a = t * per, b = std::min(total, a + per);
        if (a < b && madvise(base + a, b - a, MADV_POPULATE_WRITE) != 0) die("madvise");
      });
    }
    double t1 = now();
    std::atomic<size_t> next{0};
    // falloc-ahead: bytes [0, reserved) of the segment have their pages.
    std::atomic<uint64_t> reserved{0};
    std::thread ahead;
    if (mode == "falloc-ahead") {
      ahead = std::thread([&] {
        for (uint64_t at = 0; at < total; at += chunk) {
          uint64_t n = std::min(chunk, total - at);
          if (fallocate(seg, 0, at, n) != 0) die("fallocate");
          reserved.store(at + n, std::memory_order_release);
        }
      });
    }
    onThreads(threads, [&](unsigned) {
      std::vector<char> buf(mapped ? 0 : chunk);
      for (size_t i; (i = next++) < chunks.size();) {
        const Chunk& c = chunks[i];
        if (mode == "populate-chunk") {
          uint64_t a = c.dst / 4096 * 4096, b = std::min(total, (c.dst + c.bytes + 4095) / 4096 * 4096);
          if (madvise(base + a, b - a, MADV_POPULATE_WRITE) != 0) die("madvise");
        }
        if (mode == "falloc-ahead") {
          while (reserved.load(std::memory_order_acquire) < c.dst + c.bytes) std::this_thread::yield();
        }
        if (mapped) {
          readFull(c.fd, base + c.dst, c.bytes, c.src);
        } else {
          readFull(c.fd, buf.data(), c.bytes, c.src);
          writeFull(seg, buf.data(), c.bytes, c.dst);
        }
      }
    });
    if (ahead.joinable()) ahead.join();
    double t2 = now();
    if (base) munmap(base, total);
    close(seg);
    double cpu = cpuSeconds() - cpu0;
    printf("{\"mode\":\"%s\",\"threads\":%u,\"chunkKiB\":%llu,\"bytes\":%llu,\"createS\":%.3f,\"copyS\":%.3f,\"totalS\":%.3f,\"cpuS\":%.3f,\"GBs\":%.2f}\n", mode.c_str(), threads, static_cast<unsigned long long>(chunk >> 10),
           static_cast<unsigned long long>(total), t1 - t0, t2 - t1, t2 - t0, cpu, total / (t2 - t0) / 1e9);
    fflush(stdout);
  }
}
