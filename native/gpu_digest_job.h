// One digest piece for the GPU digest kernel (native/gpu/xxh3_pieces.cu): where its bytes lie in
// device memory and which digest it is. The host (cuda_digests.cpp) writes a table of these into
// device memory before the fill; both sides compile this header, so the layout is one.
#pragma once
#include <stdint.h>

namespace weightd {

struct GpuDigestJob {
  uint64_t src;    // device address of the piece's first byte
  uint64_t bytes;  // at most ContentDigests::kPieceBytes
  uint64_t slot;   // its digest's place in the output: 16 canonical bytes at 16 * slot
  // 0: the piece is hashed where it lies. Else the device address its bytes are copied to as the
  // warp hashes them (a pull's copy, native/cuda_update_segments.cpp): the bytes are read once
  // for both. Both addresses are then 8-byte aligned.
  uint64_t dst;
};

// The kernels' names (native/gpu/xxh3_pieces.cu) carry this layout (32 bytes a job): an addon looks
// up only its own, so a kernel file built from another version's source, whose jobs are laid out
// otherwise, has none, and digests are hashed on the CPU (saying why) rather than misread.
#define WEIGHTD_HASH_KERNEL weightd_xxh3_pieces_j32
#define WEIGHTD_COPY_KERNEL weightd_xxh3_copy_pieces_j32
#define WEIGHTD_NAME_OF(kernel) WEIGHTD_NAME_TEXT(kernel)
#define WEIGHTD_NAME_TEXT(kernel) #kernel

// Threads per block of the kernel: 4 warps, each hashing one piece (WEIGHTD_DIGEST_BLOCK_THREADS
// overrides it for bench/gpu/digest-copy-probe.cu alone).
#ifndef WEIGHTD_DIGEST_BLOCK_THREADS
#define WEIGHTD_DIGEST_BLOCK_THREADS 128
#endif
constexpr unsigned kGpuDigestBlockThreads = WEIGHTD_DIGEST_BLOCK_THREADS;
constexpr unsigned kGpuDigestMaxRanges = 32;

// What one launch hashes: `n` runs of consecutive jobs of the table (a lane's windows since its
// last launch), passed by value as a kernel parameter. Warp w takes the w-th job of their concatenation.
struct GpuDigestRanges {
  uint32_t first[kGpuDigestMaxRanges];
  uint32_t count[kGpuDigestMaxRanges];
  uint32_t n;
};

}  // namespace weightd
