// Checks native/xxh3_core.h, the xxh3-128 that the fill's GPU digest kernel runs, against the
// xxHash library on the CPU: the short paths as they are, and the long path as a warp runs it
// (native/gpu/xxh3_pieces.cu), its 32 threads simulated one after another and their terms added
// the way the kernel's shuffles add them. Inputs of every length to 2.2 KiB and around the block
// and piece sizes, each at an 8-byte-aligned address and at a misaligned one (the kernel's two
// load paths). Prints each mismatch and "N checked, N mismatched"; exits 1 on any mismatch.
// Built and run by test/native/xxh3Core.test.ts.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "xxh3_core.h"

using namespace weightd::xxh3;

namespace {

const uint8_t kSecret[kSecretBytes] = {WEIGHTD_XXH3_SECRET};

template <bool Aligned>
Hash128 warpHash(const uint8_t* in, uint64_t len) {
  ThreadKeys keys[kWarp];
  uint64_t acc[8];
  for (unsigned t = 0; t < kWarp; ++t) keys[t] = threadKeys(t, kSecret);
  for (unsigned lane = 0; lane < 8; ++lane) acc[lane] = initialAcc(lane);
  // One block: every thread's terms, then each lane's totals, as the kernel's shuffles form them.
  auto step = [&](const uint8_t* block, unsigned stripes, bool last) {
    uint64_t products[8] = {0}, sums[8] = {0};
    for (unsigned t = 0; t < kWarp; ++t) {
      uint64_t words[kWordsPerThread] = {0};
      loadWords<Aligned>(block, t, stripes, words);
      Terms terms = blockTerms(t, words, keys[t], stripes);
      if (last && t < 8) addWord(terms, read64(in + len - kStripeBytes + 8 * t), keys[t].lastStripe);
      products[t % 8] += terms.product;
      sums[t % 8] += terms.sum;
    }
    for (unsigned lane = 0; lane < 8; ++lane) acc[lane] = mixBlock(acc[lane], products[lane], sums[lane ^ 1], keys[lane], !last);
  };
  for (uint64_t b = 0; b < wholeBlocks(len); ++b) step(in + b * kBlockBytes, kStripesPerBlock, false);
  step(in + wholeBlocks(len) * kBlockBytes, tailStripes(len), true);
  return mergeAccs(acc, len, kSecret);
}

}  // namespace

int main() {
  std::vector<uint64_t> lengths;
  for (uint64_t n = 0; n <= 2200; ++n) lengths.push_back(n);
  for (uint64_t base : {4096ull, 16384ull, 65536ull, 1ull << 20}) {
    for (uint64_t d = 0; d < 4; ++d) lengths.insert(lengths.end(), {base - 65 + d, base - 1 - d, base + d, base + 63 + d});
  }
  std::mt19937_64 rng(29);
  std::vector<uint64_t> storage((1 << 20) / 8 + 16);
  uint8_t* bytes = reinterpret_cast<uint8_t*>(storage.data());
  for (auto& w : storage) w = rng();
  unsigned checked = 0, mismatched = 0;
  for (uint64_t len : lengths) {
    for (unsigned offset : {0u, 8u, 3u}) {
      const uint8_t* in = bytes + offset;
      uint8_t want[16], got[16];
      XXH128_canonical_t c;
      XXH128_canonicalFromHash(&c, XXH3_128bits(in, len));
      std::memcpy(want, c.digest, 16);
      Hash128 h = len <= kMidsizeMax ? hashShort(in, len, kSecret) : offset % 8 ? warpHash<false>(in, len) : warpHash<true>(in, len);
      canonical(h, got);
      ++checked;
      if (std::memcmp(want, got, 16) != 0) {
        if (++mismatched <= 20) std::printf("mismatch: %llu bytes at offset %u\n", static_cast<unsigned long long>(len), offset);
      }
    }
  }
  std::printf("%u checked, %u mismatched\n", checked, mismatched);
  return mismatched ? 1 : 0;
}
