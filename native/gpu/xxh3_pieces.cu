// The fill's digest kernel: each warp hashes one digest piece (docs/spec/fingerprint.md §8) with
// xxh3-128 where the fill's copies have just put it in GPU memory, and writes its 16 canonical
// bytes. Built to PTX and SASS by CMakeLists.txt (native/gpu/build-kernel.sh) when nvcc exists,
// into a fatbin beside the addon (weightd-digests.fatbin), which native/cuda_digests.cpp reads
// and loads with cuModuleLoadData. The hash is native/xxh3_core.h, which the CPU
// check (test/native/xxh3Core.test.ts) compiles too; what only runs here is the shuffles.
#include "../gpu_digest_job.h"
#include "../xxh3_core.h"

using namespace weightd;
using namespace weightd::xxh3;

namespace {

__constant__ uint8_t kSecret[kSecretBytes] = {WEIGHTD_XXH3_SECRET};
constexpr unsigned kFull = 0xffffffffu;
// Blocks loaded ahead of the one being mixed: the loads of one group are in flight together,
// so a warp waits for memory once per group, not once per 1 KiB block.
constexpr unsigned kGroup = 4;

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

template <bool Aligned>
__device__ Hash128 hashLong(const uint8_t* in, uint64_t len, unsigned thread) {
  const ThreadKeys keys = threadKeys(thread, kSecret);
  uint64_t acc = initialAcc(thread % 8);
  const uint64_t blocks = wholeBlocks(len);
  uint64_t b = 0;
  for (; b + kGroup <= blocks; b += kGroup) {
    uint64_t words[kGroup][kWordsPerThread];
#pragma unroll
    for (unsigned g = 0; g < kGroup; ++g) loadWords<Aligned>(in + (b + g) * kBlockBytes, thread, kStripesPerBlock, words[g]);
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

}  // namespace

extern "C" __global__ void __launch_bounds__(kGpuDigestBlockThreads)
    weightd_xxh3_pieces(const GpuDigestJob* jobs, GpuDigestRanges ranges, uint8_t* digests) {
  unsigned warp = blockIdx.x * (kGpuDigestBlockThreads / kWarp) + threadIdx.x / kWarp;
  const unsigned thread = threadIdx.x % kWarp;
  unsigned r = 0;
  while (r < ranges.n && warp >= ranges.count[r]) warp -= ranges.count[r++];
  if (r == ranges.n) return;  // the whole warp: the shuffles below need all 32 threads
  const GpuDigestJob job = jobs[ranges.first[r] + warp];
  const uint8_t* in = reinterpret_cast<const uint8_t*>(job.src);
  Hash128 h;
  if (job.bytes <= kMidsizeMax) {
    if (thread != 0) return;
    h = hashShort(in, job.bytes, kSecret);
  } else {
    h = job.src % 8 == 0 ? hashLong<true>(in, job.bytes, thread) : hashLong<false>(in, job.bytes, thread);
  }
  if (thread == 0) canonical(h, digests + 16 * job.slot);
}
