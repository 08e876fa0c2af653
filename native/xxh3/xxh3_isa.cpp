// xxh3-128 compiled for one x86 instruction set (CMakeLists.txt builds this file once per ISA,
// with -m<isa> and WEIGHTD_XXH3_NAME naming the function): xxHash picks its widest vector code at
// compile time, and the baseline x86-64 build (SSE2) hashed 4.9 GB/s on a core that the AVX2
// build hashed at 16.8 and the AVX-512 build at 23.3. native/xxh3_128.cpp picks one at run time.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../xxh3_128.h"

namespace weightd {

void WEIGHTD_XXH3_NAME(const void* data, size_t length, unsigned char* out) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(data, length));
  for (size_t i = 0; i < sizeof c.digest; ++i) out[i] = c.digest[i];
}

}  // namespace weightd
