#include "cuda_segment_digests.h"

#include <algorithm>
#include <atomic>

#include "content_digests.h"
#include "cuda_digests.h"
#include "cuda_resources.h"
#include "cuda_vmm.h"
#include "reader_threads.h"

namespace weightd {

namespace {

// Read back a window at a time, each cut at a piece boundary (content_digests.h) so that every
// piece lies whole in one window.
constexpr uint64_t kDigestWindow = 64ull << 20;
// A window is hashed on several threads, each taking whole pieces of at least this much.
constexpr uint64_t kDigestPart = 4ull << 20;

}  // namespace

CudaDigests digestDeviceSegments(const std::vector<CUdeviceptr>& segments, const std::vector<uint64_t>& bytes, std::vector<TensorRange> tensors,
                                 unsigned threads, bool onGpu) {
  CudaDigests out;
  for (const TensorRange& t : tensors) {
    if (t.file >= segments.size() || segments[t.file] == 0) {
      throw DeviceError("E_BAD_PLAN", "a tensor to digest lies in segment " + std::to_string(t.file) + ", which is not mapped for the digests");
    }
  }
  ContentDigests digests(std::move(tensors), bytes);
  if (digests.empty()) return out;
  if (onGpu) out.gpuDigestUnavailable = hashDeviceSegments(segments, bytes, digests);
  if (onGpu && out.gpuDigestUnavailable.empty()) {
    out.onGpu = true;
    out.digests = digests.tensorDigests();
    return out;
  }
  PinnedHostMemory window = allocatePinnedHost(kDigestWindow);
  const char* host = static_cast<const char*>(window.get());
  std::atomic<bool> cancel{false};
  for (uint32_t s = 0; s < segments.size(); ++s) {
    // Not mapped (0): a segment the caller left out, which holds none of `tensors`.
    if (segments[s] == 0) continue;
    for (uint64_t at = 0; at < bytes[s];) {
      uint64_t end = digests.cut(s, at, std::min(bytes[s], at + kDigestWindow));
      cudaDriver().cuMemcpyDtoH_v2(window.get(), segments[s] + at, end - at);
      std::vector<std::pair<uint64_t, uint64_t>> parts;
      uint64_t step = std::max(kDigestPart, (end - at) / std::max(1u, threads));
      for (uint64_t a = at; a < end;) {
        uint64_t b = digests.cut(s, a, std::min(end, a + step));
        parts.emplace_back(a, b);
        a = b;
      }
      runOnReaderThreads(parts.size(), threads, cancel, [&](size_t k) { digests.hashCovered(s, parts[k].first, parts[k].second, host + (parts[k].first - at)); });
      at = end;
    }
  }
  // Every piece lay whole in a window, so none is left for ContentDigests::hashRest to read.
  out.digests = digests.tensorDigests();
  return out;
}

CudaDigests cudaDigestSegments(int deviceIndex, const std::vector<int>& fds, const std::vector<uint64_t>& bytes, std::vector<TensorRange> tensors,
                               unsigned threads, bool onGpu) {
  if (fds.size() != bytes.size()) throw DeviceError("E_BAD_PLAN", "cudaDigestSegments takes one descriptor and size per segment");
  PrimaryContext context(deviceIndex);
  ScopedContext current(context.get());
  CUdevice dev = cudaDeviceAt(deviceIndex);
  std::vector<VmmSegment> segments;
  std::vector<CUdeviceptr> pointers;
  for (size_t i = 0; i < fds.size(); ++i) {
    segments.push_back(VmmSegment::import(dev, fds[i], vmmSegmentSize(dev, bytes[i])));
    pointers.push_back(segments.back().pointer());
  }
  return digestDeviceSegments(pointers, bytes, std::move(tensors), threads, onGpu);
}

}  // namespace weightd
