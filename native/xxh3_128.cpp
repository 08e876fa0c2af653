#include "xxh3_128.h"

// Header-only (XXH_INLINE_ALL): the addon needs no libxxhash at run time, so it loads on any
// machine the build's object code runs on.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace weightd {

namespace {

using Hash = void (*)(const void*, size_t, unsigned char*);

void baseline(const void* data, size_t length, unsigned char* out) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(data, length));
  for (size_t i = 0; i < sizeof c.digest; ++i) out[i] = c.digest[i];
}

Hash choose() {
#if defined(__x86_64__) && defined(WEIGHTD_XXH3_X86_VARIANTS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return xxh3_128_avx512f;
  if (__builtin_cpu_supports("avx2")) return xxh3_128_avx2;
#endif
  return baseline;
}

}  // namespace

void xxh3_128(const void* data, size_t length, unsigned char* out) {
  static const Hash hash = choose();
  hash(data, length, out);
}

std::string hexOf(const unsigned char* bytes, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  return out;
}

}  // namespace weightd
