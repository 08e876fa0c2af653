// xxh3-128 (seed 0, the default secret), written once for both compilers: g++ builds it into the
// CPU check (test/native/xxh3Core.test.ts compares it with the xxHash library) and nvcc into the
// fill's digest kernel (native/gpu/xxh3_pieces.cu), which hashes each digest piece
// (docs/spec/fingerprint.md §8) with one warp.
//
// Why a warp can share one hash: XXH3 folds its input into 8 64-bit accumulators one 1 KiB block
// at a time, and within a block each accumulator only gains a sum of terms, one per 8-byte word
// (additions mod 2^64, so in any order); only the scramble between blocks is sequential. Each of
// 32 threads takes 4 of a block's 128 words (blockTerms), the warp adds the terms of the threads
// that feed the same accumulator, and every thread then scrambles its accumulator (mixBlock).
// Inputs of at most 240 bytes take XXH3's short paths on one thread (hashShort).
//
// The algorithm is xxHash's (doc/xxhash_spec.md in its repository, BSD-2-Clause), transcribed
// from its reference code; the names of its steps are kept so the two can be read side by side.
#pragma once
#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define WEIGHTD_HD __host__ __device__ __forceinline__
#else
#define WEIGHTD_HD inline
#endif

// xxHash's XXH3_kSecret: a macro, so host and device each define their own copy from one list.
#define WEIGHTD_XXH3_SECRET                                                                         \
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, \
  0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, \
  0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, \
  0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, \
  0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, \
  0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, \
  0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, \
  0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, \
  0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, \
  0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, \
  0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, \
  0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e

namespace weightd {
namespace xxh3 {

constexpr uint64_t kPrime32_1 = 0x9E3779B1ull;
constexpr uint64_t kPrime32_2 = 0x85EBCA77ull;
constexpr uint64_t kPrime32_3 = 0xC2B2AE3Dull;
constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ull;
constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ull;

constexpr size_t kSecretBytes = 192;
constexpr size_t kStripeBytes = 64;
constexpr size_t kStripesPerBlock = (kSecretBytes - kStripeBytes) / 8;  // 16
constexpr size_t kBlockBytes = kStripeBytes * kStripesPerBlock;           // 1024
constexpr size_t kMidsizeMax = 240;
// A warp's threads, and how many of a block's 128 words each takes: thread t takes words
// t, t + 32, t + 64 and t + 96, all of accumulator lane t % 8 (stripes t / 8 + 4k).
constexpr unsigned kWarp = 32;
constexpr unsigned kWordsPerThread = 4;

struct Hash128 {
  uint64_t low;
  uint64_t high;
};

// Little-endian reads at any alignment (byte by byte: also right on the GPU, which faults on a
// misaligned 8-byte load).
WEIGHTD_HD uint64_t read64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
WEIGHTD_HD uint32_t read32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
WEIGHTD_HD uint32_t swap32(uint32_t x) {
  return (x << 24) | ((x << 8) & 0x00ff0000u) | ((x >> 8) & 0x0000ff00u) | (x >> 24);
}
WEIGHTD_HD uint64_t swap64(uint64_t x) {
  return (static_cast<uint64_t>(swap32(static_cast<uint32_t>(x))) << 32) | swap32(static_cast<uint32_t>(x >> 32));
}
WEIGHTD_HD uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }
WEIGHTD_HD uint64_t mult32to64(uint64_t a, uint64_t b) { return static_cast<uint64_t>(static_cast<uint32_t>(a)) * static_cast<uint32_t>(b); }
WEIGHTD_HD Hash128 mult64to128(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return {a * b, __umul64hi(a, b)};
#else
  unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return {static_cast<uint64_t>(p), static_cast<uint64_t>(p >> 64)};
#endif
}
WEIGHTD_HD uint64_t mul128Fold64(uint64_t a, uint64_t b) {
  Hash128 p = mult64to128(a, b);
  return p.low ^ p.high;
}
WEIGHTD_HD uint64_t xorshift64(uint64_t v, int s) { return v ^ (v >> s); }
WEIGHTD_HD uint64_t avalanche(uint64_t h) {
  h = xorshift64(h, 37);
  h *= 0x165667919E3779F9ull;
  return xorshift64(h, 32);
}
WEIGHTD_HD uint64_t xxh64Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  h ^= h >> 32;
  return h;
}

// ---- inputs of at most 240 bytes: one thread (XXH3_len_*_128b, seed 0) ----

WEIGHTD_HD Hash128 len1to3(const uint8_t* in, size_t len, const uint8_t* secret) {
  uint32_t c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
  uint32_t lo = (c1 << 16) | (c2 << 24) | c3 | (static_cast<uint32_t>(len) << 8);
  uint32_t hi = rotl32(swap32(lo), 13);
  uint64_t flipLo = read32(secret) ^ read32(secret + 4);
  uint64_t flipHi = read32(secret + 8) ^ read32(secret + 12);
  return {xxh64Avalanche(lo ^ flipLo), xxh64Avalanche(hi ^ flipHi)};
}

WEIGHTD_HD Hash128 len4to8(const uint8_t* in, size_t len, const uint8_t* secret) {
  uint64_t in64 = read32(in) + (static_cast<uint64_t>(read32(in + len - 4)) << 32);
  uint64_t keyed = in64 ^ (read64(secret + 16) ^ read64(secret + 24));
  Hash128 m = mult64to128(keyed, kPrime64_1 + (len << 2));
  m.high += m.low << 1;
  m.low ^= m.high >> 3;
  m.low = xorshift64(m.low, 35);
  m.low *= 0x9FB21C651E98DF25ull;
  m.low = xorshift64(m.low, 28);
  m.high = avalanche(m.high);
  return m;
}

WEIGHTD_HD Hash128 len9to16(const uint8_t* in, size_t len, const uint8_t* secret) {
  uint64_t flipLo = read64(secret + 32) ^ read64(secret + 40);
  uint64_t flipHi = read64(secret + 48) ^ read64(secret + 56);
  uint64_t inLo = read64(in);
  uint64_t inHi = read64(in + len - 8);
  Hash128 m = mult64to128(inLo ^ inHi ^ flipLo, kPrime64_1);
  m.low += static_cast<uint64_t>(len - 1) << 54;
  inHi ^= flipHi;
  m.high += inHi + mult32to64(static_cast<uint32_t>(inHi), kPrime32_2 - 1);
  m.low ^= swap64(m.high);
  Hash128 h = mult64to128(m.low, kPrime64_2);
  h.high += m.high * kPrime64_2;
  return {avalanche(h.low), avalanche(h.high)};
}

WEIGHTD_HD uint64_t mix16B(const uint8_t* in, const uint8_t* secret, uint64_t seed) {
  return mul128Fold64(read64(in) ^ (read64(secret) + seed), read64(in + 8) ^ (read64(secret + 8) - seed));
}

WEIGHTD_HD Hash128 mix32B(Hash128 acc, const uint8_t* in1, const uint8_t* in2, const uint8_t* secret, uint64_t seed) {
  acc.low += mix16B(in1, secret, seed);
  acc.low ^= read64(in2) + read64(in2 + 8);
  acc.high += mix16B(in2, secret + 16, seed);
  acc.high ^= read64(in1) + read64(in1 + 8);
  return acc;
}

WEIGHTD_HD Hash128 finishMid(Hash128 acc, size_t len) {
  uint64_t low = acc.low + acc.high;
  uint64_t high = acc.low * kPrime64_1 + acc.high * kPrime64_4 + static_cast<uint64_t>(len) * kPrime64_2;
  return {avalanche(low), 0 - avalanche(high)};
}

WEIGHTD_HD Hash128 len17to128(const uint8_t* in, size_t len, const uint8_t* secret) {
  Hash128 acc{len * kPrime64_1, 0};
  if (len > 32) {
    if (len > 64) {
      if (len > 96) acc = mix32B(acc, in + 48, in + len - 64, secret + 96, 0);
      acc = mix32B(acc, in + 32, in + len - 48, secret + 64, 0);
    }
    acc = mix32B(acc, in + 16, in + len - 32, secret + 32, 0);
  }
  acc = mix32B(acc, in, in + len - 16, secret, 0);
  return finishMid(acc, len);
}

WEIGHTD_HD Hash128 len129to240(const uint8_t* in, size_t len, const uint8_t* secret) {
  constexpr size_t kStartOffset = 3, kLastOffset = 17, kSecretMin = 136;
  const int rounds = static_cast<int>(len / 32);
  Hash128 acc{len * kPrime64_1, 0};
  for (int i = 0; i < 4; ++i) acc = mix32B(acc, in + 32 * i, in + 32 * i + 16, secret + 32 * i, 0);
  acc = {avalanche(acc.low), avalanche(acc.high)};
  for (int i = 4; i < rounds; ++i) acc = mix32B(acc, in + 32 * i, in + 32 * i + 16, secret + kStartOffset + 32 * (i - 4), 0);
  acc = mix32B(acc, in + len - 16, in + len - 32, secret + kSecretMin - kLastOffset - 16, 0);
  return finishMid(acc, len);
}

// xxh3-128 of an input of at most kMidsizeMax bytes.
WEIGHTD_HD Hash128 hashShort(const uint8_t* in, size_t len, const uint8_t* secret) {
  if (len > 128) return len129to240(in, len, secret);
  if (len > 16) return len17to128(in, len, secret);
  if (len > 8) return len9to16(in, len, secret);
  if (len >= 4) return len4to8(in, len, secret);
  if (len > 0) return len1to3(in, len, secret);
  return {xxh64Avalanche(read64(secret + 64) ^ read64(secret + 72)), xxh64Avalanche(read64(secret + 80) ^ read64(secret + 88))};
}

// ---- inputs of more than 240 bytes: one warp (XXH3_hashLong_128b) ----

// The accumulators' start, per lane (XXH3_INIT_ACC).
WEIGHTD_HD uint64_t initialAcc(unsigned lane) {
  switch (lane) {
    case 0: return kPrime32_3;
    case 1: return kPrime64_1;
    case 2: return kPrime64_2;
    case 3: return kPrime64_3;
    case 4: return kPrime64_4;
    case 5: return kPrime32_2;
    case 6: return kPrime64_5;
    default: return kPrime32_1;
  }
}

// What one thread keeps for a whole input: the secret words its block words are keyed with, and
// its lane's scramble and last-stripe keys.
struct ThreadKeys {
  uint64_t word[kWordsPerThread];
  uint64_t scramble;
  uint64_t lastStripe;
};

WEIGHTD_HD ThreadKeys threadKeys(unsigned thread, const uint8_t* secret) {
  ThreadKeys k;
  const unsigned lane = thread % 8, stripe = thread / 8;
  // Stripe s of a block is keyed with the secret from byte 8 s on; its word of lane i with the
  // 8 bytes at 8 (s + i).
  for (unsigned w = 0; w < kWordsPerThread; ++w) k.word[w] = read64(secret + 8 * (stripe + 4 * w + lane));
  k.scramble = read64(secret + kSecretBytes - kStripeBytes + 8 * lane);
  k.lastStripe = read64(secret + kSecretBytes - kStripeBytes - 7 + 8 * lane);
  return k;
}

// Loads the thread's words of the first `stripes` stripes of the block at `block` (word k = the
// block's word thread + 32 k); words past them are left alone: they may lie past the input's end.
// Aligned: `block` is 8-byte aligned, and whole words are loaded at once (the GPU's fast path).
template <bool Aligned>
WEIGHTD_HD void loadWords(const uint8_t* block, unsigned thread, unsigned stripes, uint64_t* words) {
  for (unsigned w = 0; w < kWordsPerThread; ++w) {
    if (thread / 8 + 4 * w >= stripes) continue;
    const uint8_t* p = block + 8 * (thread + kWarp * w);
    words[w] = Aligned ? *reinterpret_cast<const uint64_t*>(p) : read64(p);
  }
}

// One thread's terms: `product` goes to its lane's accumulator, `sum` to the neighbouring lane's
// (lane ^ 1), as XXH3_scalarRound adds them.
struct Terms {
  uint64_t product = 0;
  uint64_t sum = 0;
};

WEIGHTD_HD void addWord(Terms& t, uint64_t value, uint64_t key) {
  uint64_t keyed = value ^ key;
  t.sum += value;
  t.product += mult32to64(keyed, keyed >> 32);
}

// The thread's terms for the first `stripes` stripes (16 for a whole block) of the block whose
// words it has loaded into `words` (word k = the block's word thread + 32 k; words of stripes past
// `stripes` are ignored).
WEIGHTD_HD Terms blockTerms(unsigned thread, const uint64_t* words, const ThreadKeys& keys, unsigned stripes) {
  Terms t;
  for (unsigned w = 0; w < kWordsPerThread; ++w) {
    if (thread / 8 + 4 * w < stripes) addWord(t, words[w], keys.word[w]);
  }
  return t;
}

// A lane's accumulator after a block: `products` and `sums` are the warp's totals of the terms of
// this lane and of lane ^ 1; `scramble` false for the last (partial) block, which is not scrambled.
WEIGHTD_HD uint64_t mixBlock(uint64_t acc, uint64_t products, uint64_t neighbourSums, const ThreadKeys& keys, bool scramble) {
  acc += products + neighbourSums;
  if (!scramble) return acc;
  acc = xorshift64(acc, 47);
  acc ^= keys.scramble;
  return acc * kPrime32_1;
}

// The digest from the 8 final accumulators (XXH3_mergeAccs, twice).
WEIGHTD_HD Hash128 mergeAccs(const uint64_t* acc, uint64_t len, const uint8_t* secret) {
  constexpr size_t kMergeStart = 11;
  const uint8_t* lowKey = secret + kMergeStart;
  const uint8_t* highKey = secret + kSecretBytes - 64 - kMergeStart;
  uint64_t low = len * kPrime64_1, high = ~(len * kPrime64_2);
  for (int i = 0; i < 4; ++i) {
    low += mul128Fold64(acc[2 * i] ^ read64(lowKey + 16 * i), acc[2 * i + 1] ^ read64(lowKey + 16 * i + 8));
    high += mul128Fold64(acc[2 * i] ^ read64(highKey + 16 * i), acc[2 * i + 1] ^ read64(highKey + 16 * i + 8));
  }
  return {avalanche(low), avalanche(high)};
}

// How a long input splits: whole blocks (each scrambled), then a partial block of `tailStripes`
// stripes and the last 64 bytes, accumulated together without a scramble.
WEIGHTD_HD uint64_t wholeBlocks(uint64_t len) { return (len - 1) / kBlockBytes; }
WEIGHTD_HD unsigned tailStripes(uint64_t len) { return static_cast<unsigned>(((len - 1) - kBlockBytes * wholeBlocks(len)) / kStripeBytes); }

// The 16 canonical bytes (high 64 bits first, big-endian) of a digest.
WEIGHTD_HD void canonical(Hash128 h, uint8_t* out) {
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<uint8_t>(h.high >> (56 - 8 * i));
    out[8 + i] = static_cast<uint8_t>(h.low >> (56 - 8 * i));
  }
}

}  // namespace xxh3
}  // namespace weightd
