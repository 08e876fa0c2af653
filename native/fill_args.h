// startFill's arguments, checked and turned into plain C++ data before a fill thread sees them.
#pragma once
#include <napi.h>

#include <string>
#include <vector>

#include "device.h"

namespace weightd {

struct FillArgs {
  std::vector<std::string> files;
  std::vector<CopyOp> ops;
  std::vector<ZeroRange> zeros;
  std::vector<TensorRange> tensors;
  FillOptions options;
};

// startFill(files: string[], ops: Float64Array, zeroRanges: Float64Array, options: object,
// tensorRanges?: Float64Array): the records as src/native/fillRecords.ts packs them
// (fill_records.h), the options with every number src/native/fillPolicy.ts decides, and the
// tensors to digest (none when absent). Throws a TypeError or RangeError naming the value.
FillArgs fillArgsFromJs(const Napi::CallbackInfo& info);

// A Float64Array of tensor ranges (zero ranges) as src/native/fillRecords.ts packs them.
std::vector<TensorRange> tensorRangesFromJs(const Napi::Value& v);
std::vector<ZeroRange> zeroRangesFromJs(const Napi::Value& v);
std::vector<CommitCopy> commitCopiesFromJs(const Napi::Value& v);

// Where digest pieces are hashed ('gpu': true, 'cpu': false), a fill's digestOn option or a cuda
// commit's and verify's argument (src/native/fillPolicy.ts decides it). RangeError otherwise.
bool digestOnGpuFromJs(const Napi::Value& v);

}  // namespace weightd
