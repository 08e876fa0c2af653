// Measures ways of moving file bytes (page cache warm) to one or several GPUs, outside the
// daemon, to choose the copy engine's design for multi-GPU nodes (docs/gpu-results.md).
//
//   copy-probe --files a,b,... --gpus 0,1 --mode pread|register|pin|hybrid --share whole|split
//              --engine shared|separate --threads T --chunk-mib C [--reps R]
//              [--reg-threads N --reg-run K]
//
// The files are cut into C MiB chunks. `--share whole`: every GPU needs every chunk (replicas);
// `split`: chunk i goes to GPU i mod G (tensor-parallel ranks read disjoint bytes).
// `--engine separate`: one pool of T threads per GPU, each reading what its GPU needs (the
// daemon's design before this probe: one engine per rank); `shared`: one pool of T threads for
// the node, each chunk read once and copied to every GPU that needs it.
// Modes: `pread` reads into pinned staging slots (2 per thread); `register` maps every file once
// and pins (cuMemHostRegister, read-only) each chunk of that one mapping, then DMAs from the page
// cache; `pin` only pins and unpins (the cost of registration alone); `hybrid` runs both at once:
// the first N threads pin runs of K chunks from the back of the work list and DMA from the page
// cache, the others pread chunks from the front (does a second path add to the first?).
// Prints one JSON line per rep: seconds and GB/s of bytes landed on the GPUs.
//
// Build here (cuda.h from the CUDA headers; libcuda is opened at run time, as in the addon):
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o .device/copy-probe
//       bench/gpu/copy-probe.cpp native/cuda_driver.cpp -ldl -lpthread
// The run that chose the engine's design: bench/gpu/results/2026-11-30-h200x2-probe/run.sh.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../../native/cuda_driver.h"

using namespace weightd;

namespace {

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    if (end > pos) out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

struct File {
  int fd;
  uint64_t size;
  const char* map = nullptr;
};

struct Piece {
  uint32_t file;
  uint64_t offset, length, dstOffset;
  uint32_t targetMask;  // bit g: GPU g needs it
};

struct Gpu {
  CUcontext ctx;
  CUdeviceptr dst;
};

struct Options {
  std::vector<std::string> files;
  std::vector<int> gpus;
  std::string mode = "pread", share = "split", engine = "shared";
  unsigned threads = 8;
  uint64_t chunk = 2ull << 20;
  int reps = 3;
  unsigned regThreads = 0;  // hybrid: threads that register instead of reading
  size_t regRun = 1;        // chunks pinned by one registration
};

struct Slot {
  void* staging = nullptr;
  const char* pinned = nullptr;
  std::vector<CUevent> copied;  // one per GPU
  uint32_t pendingMask = 0;
};

struct Worker {
  std::vector<CUstream> streams;  // one per GPU
  Slot slots[2];
  int next = 0;
};

const CudaDriver& drv() { return cudaDriver(); }

void retire(Slot& s, const std::vector<Gpu>&) {
  for (size_t g = 0; g < s.copied.size(); ++g) {
    if (s.pendingMask & (1u << g)) drv().cuEventSynchronize(s.copied[g]);
  }
  s.pendingMask = 0;
  if (s.pinned) {
    drv().cuMemHostUnregister(const_cast<char*>(s.pinned));
    s.pinned = nullptr;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--files") o.files = splitList(v);
    else if (k == "--gpus") { for (auto& g : splitList(v)) o.gpus.push_back(std::stoi(g)); }
    else if (k == "--mode") o.mode = v;
    else if (k == "--share") o.share = v;
    else if (k == "--engine") o.engine = v;
    else if (k == "--threads") o.threads = std::stoul(v);
    else if (k == "--chunk-mib") o.chunk = std::stoull(v) << 20;
    else if (k == "--reps") o.reps = std::stoi(v);
    else if (k == "--reg-threads") o.regThreads = std::stoul(v);
    else if (k == "--reg-run") o.regRun = std::stoull(v);
    else { fprintf(stderr, "unknown flag %s\n", k.c_str()); return 2; }
  }
  const size_t G = o.gpus.size();
  std::vector<File> files;
  uint64_t total = 0;
  for (auto& p : o.files) {
    int fd = open(p.c_str(), O_RDONLY);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) { perror(p.c_str()); return 1; }
    files.push_back({fd, static_cast<uint64_t>(st.st_size)});
    total += st.st_size;
  }
  // Pieces, and per GPU where each lands (dense in its buffer).
  std::vector<Piece> pieces;
  std::vector<uint64_t> need(G, 0);
  size_t index = 0;
  for (uint32_t f = 0; f < files.size(); ++f) {
    for (uint64_t off = 0; off < files[f].size; off += o.chunk, ++index) {
      uint64_t len = std::min(o.chunk, files[f].size - off);
      uint32_t mask = o.share == "whole" ? (1u << G) - 1 : 1u << (index % G);
      pieces.push_back({f, off, len, 0, mask});
    }
  }
  std::vector<Gpu> gpus(G);
  uint64_t landed = 0;
  for (size_t g = 0; g < G; ++g) {
    CUdevice d;
    drv().cuDeviceGet(&d, o.gpus[g]);
    drv().cuDevicePrimaryCtxRetain(&gpus[g].ctx, d);
    for (auto& p : pieces) if (p.targetMask & (1u << g)) need[g] += p.length;
    landed += need[g];
    drv().cuCtxPushCurrent_v2(gpus[g].ctx);
    drv().cuMemAlloc_v2(&gpus[g].dst, need[g] ? need[g] : 1);
    CUcontext popped;
    drv().cuCtxPopCurrent_v2(&popped);
  }
  // Destination offsets: each GPU's pieces back to back, in piece order.
  std::vector<std::vector<uint64_t>> dstOff(G, std::vector<uint64_t>(pieces.size(), 0));
  for (size_t g = 0; g < G; ++g) {
    uint64_t at = 0;
    for (size_t i = 0; i < pieces.size(); ++i) if (pieces[i].targetMask & (1u << g)) { dstOff[g][i] = at; at += pieces[i].length; }
  }
  // Work lists: shared = one list of every piece for all T threads; separate = per GPU a list of
  // its pieces, each served by T threads that copy only to that GPU.
  struct Group { std::vector<size_t> items; uint32_t onlyMask; };
  std::vector<Group> groups;
  if (o.engine == "shared") {
    Group all{{}, (1u << G) - 1};
    for (size_t i = 0; i < pieces.size(); ++i) all.items.push_back(i);
    groups.push_back(all);
  } else {
    for (size_t g = 0; g < G; ++g) {
      Group one{{}, 1u << g};
      for (size_t i = 0; i < pieces.size(); ++i) if (pieces[i].targetMask & (1u << g)) one.items.push_back(i);
      groups.push_back(one);
    }
  }
  bool map = o.mode != "pread";
  for (int rep = 0; rep < o.reps; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    if (map) {
      for (auto& f : files) {
        void* p = mmap(nullptr, f.size, PROT_READ, MAP_SHARED, f.fd, 0);
        if (p == MAP_FAILED) { perror("mmap"); return 1; }
        f.map = static_cast<const char*>(p);
      }
    }
    std::vector<std::thread> threads;
    std::atomic<bool> failed{false};
    for (auto& group : groups) {
      // pread threads take items from the front, registering threads runs from the back.
      struct Cursor {
        std::mutex m;
        size_t front = 0, back = 0;
      };
      auto cursor = std::make_shared<Cursor>();
      cursor->back = group.items.size();
      for (unsigned t = 0; t < o.threads; ++t) {
        const bool reg = o.mode == "register" || o.mode == "pin" || (o.mode == "hybrid" && t < o.regThreads);
        threads.emplace_back([&, cursor, reg, &group = group] {
          try {
            // Host allocations and registrations need a current context (PORTABLE makes them
            // pinned for every context); copies push their GPU's context on top.
            drv().cuCtxPushCurrent_v2(gpus[0].ctx);
            Worker w;
            w.streams.resize(G);
            for (size_t g = 0; g < G; ++g) {
              drv().cuCtxPushCurrent_v2(gpus[g].ctx);
              drv().cuStreamCreate(&w.streams[g], CU_STREAM_NON_BLOCKING);
              for (auto& s : w.slots) {
                CUevent e;
                drv().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
                s.copied.push_back(e);
              }
              CUcontext popped;
              drv().cuCtxPopCurrent_v2(&popped);
            }
            if (!reg) {
              for (auto& s : w.slots) drv().cuMemHostAlloc(&s.staging, o.chunk, CU_MEMHOSTALLOC_PORTABLE);
            }
            for (;;) {
              // Items [first, last) of the group: one for a reader, a run of one file for a pinner.
              size_t first, last;
              {
                std::lock_guard<std::mutex> lock(cursor->m);
                if (cursor->front >= cursor->back) break;
                if (reg) {
                  last = cursor->back;
                  first = last - 1;
                  while (first > cursor->front && last - first < o.regRun &&
                         pieces[group.items[first - 1]].file == pieces[group.items[last - 1]].file) {
                    --first;
                  }
                  cursor->back = first;
                } else {
                  first = cursor->front++;
                  last = first + 1;
                }
              }
              Slot& s = w.slots[w.next++ % 2];
              retire(s, gpus);
              const Piece& head = pieces[group.items[first]];
              const char* base;  // where byte head.offset of the file is
              if (!reg) {
                uint64_t done = 0;
                while (done < head.length) {
                  ssize_t n = pread(files[head.file].fd, static_cast<char*>(s.staging) + done, head.length - done, head.offset + done);
                  if (n <= 0) throw std::runtime_error("pread failed");
                  done += n;
                }
                base = static_cast<const char*>(s.staging);
              } else {
                const Piece& tail = pieces[group.items[last - 1]];
                base = files[head.file].map + head.offset;
                // Whole pages: chunks start on page boundaries, and a file's last page is mapped whole.
                uint64_t length = tail.offset + tail.length - head.offset;
                drv().cuMemHostRegister_v2(const_cast<char*>(base), (length + 4095) / 4096 * 4096,
                                           CU_MEMHOSTREGISTER_READ_ONLY | CU_MEMHOSTREGISTER_PORTABLE);
                s.pinned = base;
              }
              if (o.mode == "pin") continue;
              for (size_t k = first; k < last; ++k) {
                size_t i = group.items[k];
                const Piece& p = pieces[i];
                uint32_t mask = p.targetMask & group.onlyMask;
                for (size_t g = 0; g < G; ++g) {
                  if (!(mask & (1u << g))) continue;
                  drv().cuCtxPushCurrent_v2(gpus[g].ctx);
                  drv().cuMemcpyHtoDAsync_v2(gpus[g].dst + dstOff[g][i], base + (p.offset - head.offset), p.length, w.streams[g]);
                  drv().cuEventRecord(s.copied[g], w.streams[g]);
                  CUcontext popped;
                  drv().cuCtxPopCurrent_v2(&popped);
                  s.pendingMask |= 1u << g;
                }
              }
            }
            for (auto& s : w.slots) retire(s, gpus);
            for (size_t g = 0; g < G; ++g) {
              drv().cuCtxPushCurrent_v2(gpus[g].ctx);
              drv().cuStreamDestroy_v2(w.streams[g]);
              for (auto& s : w.slots) drv().cuEventDestroy_v2(s.copied[g]);
              CUcontext popped;
              drv().cuCtxPopCurrent_v2(&popped);
            }
            for (auto& s : w.slots) if (s.staging) drv().cuMemFreeHost(s.staging);
            CUcontext base;
            drv().cuCtxPopCurrent_v2(&base);
          } catch (const std::exception& e) {
            fprintf(stderr, "worker: %s\n", e.what());
            failed = true;
          }
        });
      }
    }
    for (auto& t : threads) t.join();
    if (map) for (auto& f : files) munmap(const_cast<char*>(f.map), f.size);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (failed) return 1;
    uint64_t bytes = o.mode == "pin" ? total : landed;
    printf("{\"mode\":\"%s\",\"share\":\"%s\",\"engine\":\"%s\",\"gpus\":%zu,\"threads\":%u,\"regThreads\":%u,\"regRun\":%zu,\"chunkMiB\":%llu,"
           "\"rep\":%d,\"fileBytes\":%llu,\"landedBytes\":%llu,\"seconds\":%.4f,\"GBps\":%.2f}\n",
           o.mode.c_str(), o.share.c_str(), o.engine.c_str(), G, o.threads, o.regThreads, o.regRun, (unsigned long long)(o.chunk >> 20), rep,
           (unsigned long long)total, (unsigned long long)landed, s, bytes / s / 1e9);
    fflush(stdout);
  }
  return 0;
}
