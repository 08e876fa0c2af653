// xxh3-128 (seed 0) of `length` bytes into its 16 canonical bytes (high 64 bits first), with the
// widest vector code this CPU runs (native/xxh3/xxh3_isa.cpp).
#pragma once
#include <cstddef>
#include <string>

namespace weightd {

void xxh3_128(const void* data, size_t length, unsigned char* out);

// `n` bytes as 2n lowercase hex digits: a digest's 16 canonical bytes as the fingerprint spec writes them.
std::string hexOf(const unsigned char* bytes, size_t n);

// The per-ISA builds xxh3_128 chooses from (x86-64 only; elsewhere xxHash's own choice).
void xxh3_128_avx2(const void* data, size_t length, unsigned char* out);
void xxh3_128_avx512f(const void* data, size_t length, unsigned char* out);

}  // namespace weightd
