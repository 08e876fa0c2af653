// What a fill copies, as plain C++ data, and the one C++ reading of its packed form: the
// bindings receive copy ops and zero ranges as flat Float64Arrays of records, which
// src/native/fillRecords.ts packs in the field orders named here. test/native/fillRecords.test.ts
// round-trips records through a host fill, so the two sides cannot disagree unnoticed.
#pragma once
#include <cstddef>
#include <cstdint>

namespace weightd {

// CopyOp in src/checkpoint/types.ts: `rows` rows of `rowBytes`, `srcPitch` apart in file `file`,
// written densely (rowBytes apart) at dstOffset of segment `segment`. Contiguous ranges have rows = 1.
struct CopyOp {
  uint32_t file = 0;
  uint32_t segment = 0;
  uint64_t srcOffset = 0;
  uint64_t dstOffset = 0;
  uint64_t rows = 1;
  uint64_t rowBytes = 0;
  uint64_t srcPitch = 0;
};

// ZeroRange in src/checkpoint/types.ts: bytes no op writes that must read as zero (vocab padding
// rows of an engine layout).
struct ZeroRange {
  uint32_t segment = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// A tensor of a checkpoint file, bytes [start, end) in absolute file offsets: what a fill
// digests (content_digests.h), whether or not its ops copy all of it.
struct TensorRange {
  uint32_t file = 0;
  uint64_t start = 0;
  uint64_t end = 0;
};

// CommitCopy in src/native/fillRecords.ts: one device-to-device copy of a commit
// (cuda_update_segments.h), `bytes` from `srcOffset` of source `source` to `dstOffset` of segment
// `segment`'s final allocation. Source 0 is that segment's own descriptor (its staging allocation,
// or the base's segment under a pull); source k > 0 is the writer's memory behind the k-th pulled
// IPC handle.
struct CommitCopy {
  uint32_t segment = 0;
  uint32_t source = 0;
  uint64_t srcOffset = 0;
  uint64_t dstOffset = 0;
  uint64_t bytes = 0;
};

// The packed layout of T: its field names in record order, how many leading fields are indexes
// (narrowed to uint32_t, so the bindings refuse a value past 2^32-1 rather than wrap it), and
// the record's reading once every field is known to be a non-negative safe integer.
template <typename T>
struct Record;

template <>
struct Record<CopyOp> {
  static constexpr const char* kName = "op";
  static constexpr const char* kFields[] = {"file", "segment", "srcOffset", "dstOffset", "rows", "rowBytes", "srcPitch"};
  static constexpr size_t kIndexFields = 2;
  static CopyOp unpack(const uint64_t* f) {
    return CopyOp{static_cast<uint32_t>(f[0]), static_cast<uint32_t>(f[1]), f[2], f[3], f[4], f[5], f[6]};
  }
};

template <>
struct Record<ZeroRange> {
  static constexpr const char* kName = "zero range";
  static constexpr const char* kFields[] = {"segment", "offset", "bytes"};
  static constexpr size_t kIndexFields = 1;
  static ZeroRange unpack(const uint64_t* f) { return ZeroRange{static_cast<uint32_t>(f[0]), f[1], f[2]}; }
};

template <>
struct Record<TensorRange> {
  static constexpr const char* kName = "tensor range";
  static constexpr const char* kFields[] = {"file", "start", "end"};
  static constexpr size_t kIndexFields = 1;
  static TensorRange unpack(const uint64_t* f) { return TensorRange{static_cast<uint32_t>(f[0]), f[1], f[2]}; }
};

template <>
struct Record<CommitCopy> {
  static constexpr const char* kName = "commit copy";
  static constexpr const char* kFields[] = {"segment", "source", "srcOffset", "dstOffset", "bytes"};
  static constexpr size_t kIndexFields = 2;
  static CommitCopy unpack(const uint64_t* f) { return CommitCopy{static_cast<uint32_t>(f[0]), static_cast<uint32_t>(f[1]), f[2], f[3], f[4]}; }
};

}  // namespace weightd
