// Times the pull's digest kernel (native/gpu/xxh3_pieces.cu), which copies a trainer's bytes into
// a version's memory as it hashes them, against cudaMemcpyAsync of the same bytes on the same GPU:
// one launch over every 1 MiB piece, and the pull's launches of a batch of about 1 GiB each, one
// after the other on one stream (native/cuda_update_segments.cpp). Built once per variant of the
// kernel's constants, each a binary of its own (the kernels' names are fixed):
//   nvcc -O3 -std=c++17 -arch=sm_90 [-DWEIGHTD_DIGEST_GROUP=G] [-DWEIGHTD_DIGEST_BLOCK_THREADS=T]
//        -o probe bench/gpu/digest-copy-probe.cu
//   probe [--gib 8] [--reps 7] [--batch-gib 1]
// Prints one JSON line: the variant, the kernel's registers and resident warps per SM, medians in
// ms, and a checksum of the digests (equal across variants: the same hash) and of the copy check.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../../native/gpu/xxh3_pieces.cu"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "digest-copy-probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__global__ void fillBytes(uint64_t* p, uint64_t words) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < words; i += uint64_t(gridDim.x) * blockDim.x) {
    uint64_t z = i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    p[i] = z ^ (z >> 31);
  }
}

__global__ void countDiffer(const uint64_t* a, const uint64_t* b, uint64_t words, unsigned long long* differ) {
  unsigned long long n = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < words; i += uint64_t(gridDim.x) * blockDim.x) n += a[i] != b[i];
  if (n) atomicAdd(differ, n);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 8, batchGib = 1;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--gib")) gib = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch-gib")) batchGib = std::atof(argv[i + 1]);
  }
  const uint64_t piece = 1ull << 20, bytes = uint64_t(gib * (1ull << 30)) / piece * piece, jobsN = bytes / piece;
  uint8_t *src = nullptr, *dst = nullptr, *digests = nullptr;
  GpuDigestJob* table = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc src");
  check(cudaMalloc(&dst, bytes), "cudaMalloc dst");
  check(cudaMalloc(&digests, 16 * jobsN), "cudaMalloc digests");
  check(cudaMalloc(&table, sizeof(GpuDigestJob) * 2 * jobsN), "cudaMalloc table");
  fillBytes<<<4096, 256>>>(reinterpret_cast<uint64_t*>(src), bytes / 8);
  // Jobs [0, n): copy and hash; [n, 2n): hash where they lie.
  std::vector<GpuDigestJob> jobs(2 * jobsN);
  for (uint64_t j = 0; j < jobsN; ++j) {
    jobs[j] = {uint64_t(src) + j * piece, piece, j, uint64_t(dst) + j * piece};
    jobs[jobsN + j] = {uint64_t(src) + j * piece, piece, j, 0};
  }
  check(cudaMemcpy(table, jobs.data(), sizeof(GpuDigestJob) * jobs.size(), cudaMemcpyHostToDevice), "upload jobs");
  cudaFuncAttributes attr{};
  check(cudaFuncGetAttributes(&attr, WEIGHTD_COPY_KERNEL), "attributes");
  int blocksPerSm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocksPerSm, WEIGHTD_COPY_KERNEL, kGpuDigestBlockThreads, 0), "occupancy");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  auto launch = [&](uint32_t first, uint32_t count, bool copy) {
    GpuDigestRanges r{};
    r.first[0] = first;
    r.count[0] = count;
    r.n = 1;
    const unsigned warpsPerBlock = kGpuDigestBlockThreads / 32;
    if (copy) WEIGHTD_COPY_KERNEL<<<(count + warpsPerBlock - 1) / warpsPerBlock, kGpuDigestBlockThreads, 0, stream>>>(table, r, digests);
    else WEIGHTD_HASH_KERNEL<<<(count + warpsPerBlock - 1) / warpsPerBlock, kGpuDigestBlockThreads, 0, stream>>>(table, r, digests);
  };
  const uint32_t perBatch = std::max<uint64_t>(1, uint64_t(batchGib * (1ull << 30)) / piece);
  auto timed = [&](auto&& body) {
    std::vector<double> ms;
    for (int r = 0; r <= reps; ++r) {
      cudaEventRecord(a, stream);
      body();
      cudaEventRecord(b, stream);
      check(cudaEventSynchronize(b), "run");
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      if (r > 0) ms.push_back(t);  // the first is a warm-up
    }
    return median(ms);
  };
  const double memcpyMs = timed([&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream); });
  check(cudaMemset(dst, 0, bytes), "clear dst");
  const double oneLaunchMs = timed([&] { launch(0, jobsN, true); });
  unsigned long long* counter = nullptr;
  unsigned long long differ = 0;
  check(cudaMalloc(&counter, sizeof(differ)), "counter");
  check(cudaMemcpy(counter, &differ, sizeof(differ), cudaMemcpyHostToDevice), "counter");
  countDiffer<<<4096, 256>>>(reinterpret_cast<uint64_t*>(src), reinterpret_cast<uint64_t*>(dst), bytes / 8, counter);
  check(cudaMemcpy(&differ, counter, sizeof(differ), cudaMemcpyDeviceToHost), "copy check");
  std::vector<uint8_t> got(16 * jobsN);
  check(cudaMemcpy(got.data(), digests, got.size(), cudaMemcpyDeviceToHost), "digests");
  uint64_t sum = 1469598103934665603ull;
  for (uint8_t c : got) sum = (sum ^ c) * 1099511628211ull;
  const double batchedMs = timed([&] {
    for (uint32_t f = 0; f < jobsN; f += perBatch) launch(f, std::min<uint64_t>(perBatch, jobsN - f), true);
  });
  const double hashOnlyMs = timed([&] { launch(jobsN, jobsN, false); });
  std::vector<uint8_t> hashed(16 * jobsN);
  check(cudaMemcpy(hashed.data(), digests, hashed.size(), cudaMemcpyDeviceToHost), "digests");
  std::printf(
      "{\"group\":%u,\"blockThreads\":%u,\"regs\":%d,\"warpsPerSm\":%d,\"bytes\":%llu,\"pieces\":%llu,\"reps\":%d,\"memcpyMs\":%.3f,"
      "\"copyKernelOneLaunchMs\":%.3f,\"copyKernelBatchedMs\":%.3f,\"batchGib\":%.2f,\"hashOnlyMs\":%.3f,\"digestChecksum\":\"%016llx\","
      "\"hashOnlySameDigests\":%s,\"copiedWordsDiffer\":%llu}\n",
      kGroup, kGpuDigestBlockThreads, attr.numRegs, blocksPerSm * int(kGpuDigestBlockThreads / 32), (unsigned long long)bytes, (unsigned long long)jobsN, reps,
      memcpyMs, oneLaunchMs, batchedMs, batchGib, hashOnlyMs, (unsigned long long)sum, got == hashed ? "true" : "false", differ);
  return differ == 0 && got == hashed ? 0 : 1;
}
