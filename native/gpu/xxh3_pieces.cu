// The fill's digest kernel: each warp hashes one digest piece (docs/spec/fingerprint.md §8) with
// xxh3-128 where the fill's copies have just put it in GPU memory, and writes its 16 canonical
// bytes. Built to PTX and SASS by CMakeLists.txt (native/gpu/build-kernel.sh) when nvcc exists,
// into a fatbin beside the addon (weightd-digests.fatbin), which native/cuda_digests.cpp reads
// and loads with cuModuleLoadData. The hash is native/xxh3_core.h, which the CPU
// check (test/native/xxh3Core.test.ts) compiles too; what only runs here is the shuffles.
// A job with a destination (a pull's copy) also writes every byte it reads there, so the copy and
// its digest read the writer's memory once: hashing the copied bytes afterwards read them again,
// and both are bound by the GPU's memory bandwidth.
#include "../gpu_digest_job.h"
#include "../xxh3_core.h"

using namespace weightd;
using namespace weightd::xxh3;

namespace {

__constant__ uint8_t kSecret[kSecretBytes] = {WEIGHTD_XXH3_SECRET};
constexpr unsigned kFull = 0xffffffffu;
// Blocks loaded ahead of the one being mixed: the loads of one group are in flight together,
// so a warp waits for memory once per group, not once per 1 KiB block. WEIGHTD_DIGEST_GROUP
// overrides it for bench/gpu/digest-copy-probe.cu, which times the choices.
#ifndef WEIGHTD_DIGEST_GROUP
#define WEIGHTD_DIGEST_GROUP 4
#endif
constexpr unsigned kGroup = WEIGHTD_DIGEST_GROUP;

// The warp's totals of this lane's terms, and of its neighbour's (lane ^ 1) sums: threads
// t, t ^ 8, t ^ 16 and t ^ 24 share an accumulator lane.
__device__ __forceinline__ void reduce(Terms& t, uint64_t& products, uint64_t& neighbourSums) {
  t.product += __shfl_xor_sync(kFull, t.product, 8);
  t.sum += __shfl_xor_sync(kFull, t.sum, 8);
  t.product += __shfl_xor_sync(kFull, t.product, 16);
  t.sum += __shfl_xor_sync(kFull, t.sum, 16);
  products = t.product;
  neighbourSums = __shfl_xor_sync(kFull, t.sum, 1);
}

// Writes the thread's words of the first `stripes` stripes of a block, as loadWords read them.
__device__ __forceinline__ void storeWords(uint8_t* block, unsigned thread, unsigned stripes, const uint64_t* words) {
#pragma unroll
  for (unsigned w = 0; w < kWordsPerThread; ++w) {
    if (thread / 8 + 4 * w >= stripes) continue;
    *reinterpret_cast<uint64_t*>(block + 8 * (thread + kWarp * w)) = words[w];
  }
}

// Copies bytes [from, len) of `in` to `out` with the warp: whole words, then the last few bytes.
// Only for a copying job, whose addresses are 8-byte aligned.
__device__ __forceinline__ void copyRest(const uint8_t* in, uint8_t* out, uint64_t from, uint64_t len, unsigned thread) {
  const uint64_t words = (len - from) / 8;
  for (uint64_t k = thread; k < words; k += kWarp) {
    *reinterpret_cast<uint64_t*>(out + from + 8 * k) = *reinterpret_cast<const uint64_t*>(in + from + 8 * k);
  }
  for (uint64_t i = from + 8 * words + thread; i < len; i += kWarp) out[i] = in[i];
}

// Copy: also writes the whole blocks to `out` from the words loaded for the hash (then `in` and
// `out` are 8-byte aligned, and Aligned holds); the caller copies what follows them (copyRest).
template <bool Aligned, bool Copy>
__device__ Hash128 hashLong(const uint8_t* in, uint8_t* out, uint64_t len, unsigned thread) {
  const ThreadKeys keys = threadKeys(thread, kSecret);
  uint64_t acc = initialAcc(thread % 8);
  const uint64_t blocks = wholeBlocks(len);
  uint64_t b = 0;
  for (; b + kGroup <= blocks; b += kGroup) {
    uint64_t words[kGroup][kWordsPerThread];
#pragma unroll
    for (unsigned g = 0; g < kGroup; ++g) loadWords<Aligned>(in + (b + g) * kBlockBytes, thread, kStripesPerBlock, words[g]);
    if (Copy) {
#pragma unroll
      for (unsigned g = 0; g < kGroup; ++g) storeWords(out + (b + g) * kBlockBytes, thread, kStripesPerBlock, words[g]);
    }
#pragma unroll
    for (unsigned g = 0; g < kGroup; ++g) {
      Terms t = blockTerms(thread, words[g], keys, kStripesPerBlock);
      uint64_t products, neighbourSums;
      reduce(t, products, neighbourSums);
      acc = mixBlock(acc, products, neighbourSums, keys, true);
    }
  }
  for (; b < blocks; ++b) {
    uint64_t words[kWordsPerThread];
    loadWords<Aligned>(in + b * kBlockBytes, thread, kStripesPerBlock, words);
    if (Copy) storeWords(out + b * kBlockBytes, thread, kStripesPerBlock, words);
    Terms t = blockTerms(thread, words, keys, kStripesPerBlock);
    uint64_t products, neighbourSums;
    reduce(t, products, neighbourSums);
    acc = mixBlock(acc, products, neighbourSums, keys, true);
  }
  // The partial block and the last 64 bytes, accumulated together, unscrambled.
  const unsigned stripes = tailStripes(len);
  uint64_t words[kWordsPerThread] = {0, 0, 0, 0};
  loadWords<Aligned>(in + blocks * kBlockBytes, thread, stripes, words);
  Terms t = blockTerms(thread, words, keys, stripes);
  if (thread < 8) addWord(t, read64(in + len - kStripeBytes + 8 * thread), keys.lastStripe);
  uint64_t products, neighbourSums;
  reduce(t, products, neighbourSums);
  acc = mixBlock(acc, products, neighbourSums, keys, false);
  uint64_t all[8];
#pragma unroll
  for (unsigned lane = 0; lane < 8; ++lane) all[lane] = __shfl_sync(kFull, acc, lane);
  return mergeAccs(all, len, kSecret);
}

// One warp per job of `ranges`. Copying: a job with a destination also copies its bytes there
// (WEIGHTD_COPY_KERNEL); the fill's kernel has no such job, and its build keeps the
// registers of hashing alone.
template <bool Copying>
__device__ __forceinline__ void digestJobs(const GpuDigestJob* jobs, const GpuDigestRanges& ranges, uint8_t* digests) {
  unsigned warp = blockIdx.x * (kGpuDigestBlockThreads / kWarp) + threadIdx.x / kWarp;
  const unsigned thread = threadIdx.x % kWarp;
  unsigned r = 0;
  while (r < ranges.n && warp >= ranges.count[r]) warp -= ranges.count[r++];
  if (r == ranges.n) return;  // the whole warp: the shuffles below need all 32 threads
  const GpuDigestJob job = jobs[ranges.first[r] + warp];
  const uint8_t* in = reinterpret_cast<const uint8_t*>(job.src);
  uint8_t* out = Copying ? reinterpret_cast<uint8_t*>(job.dst) : nullptr;
  Hash128 h;
  if (job.bytes <= kMidsizeMax) {
    if (Copying && out) copyRest(in, out, 0, job.bytes, thread);
    if (thread != 0) return;
    h = hashShort(in, job.bytes, kSecret);
  } else if (Copying && out) {
    h = hashLong<true, true>(in, out, job.bytes, thread);
    copyRest(in, out, wholeBlocks(job.bytes) * kBlockBytes, job.bytes, thread);
  } else {
    h = job.src % 8 == 0 ? hashLong<true, false>(in, nullptr, job.bytes, thread) : hashLong<false, false>(in, nullptr, job.bytes, thread);
  }
  if (thread == 0) canonical(h, digests + 16 * job.slot);
}

}  // namespace

// Hashes each job's piece where it lies (a fill's, a commit's); its `dst` is not read.
extern "C" __global__ void __launch_bounds__(kGpuDigestBlockThreads)
    WEIGHTD_HASH_KERNEL(const GpuDigestJob* jobs, GpuDigestRanges ranges, uint8_t* digests) {
  digestJobs<false>(jobs, ranges, digests);
}

// The same, and a job with a destination is copied there as it is hashed (a pull's).
extern "C" __global__ void __launch_bounds__(kGpuDigestBlockThreads)
    WEIGHTD_COPY_KERNEL(const GpuDigestJob* jobs, GpuDigestRanges ranges, uint8_t* digests) {
  digestJobs<true>(jobs, ranges, digests);
}
