#include "cuda_update_segments.h"

#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "cuda_resources.h"
#include "cuda_vmm.h"
#include "unix_fds.h"

namespace weightd {

namespace {

// One allocation of an update at a time, so allocations made at once (several segments, several
// ranks on one GPU) are each judged against what the ones before them took, not all against the
// same free figure.
std::mutex allocating;

void checkFree(int deviceIndex, uint64_t needed, const std::string& what) {
  size_t freeBytes = 0, totalBytes = 0;
  cudaDriver().cuMemGetInfo_v2(&freeBytes, &totalBytes);
  if (needed > freeBytes) {
    throw DeviceError("E_OUT_OF_MEMORY", what + " needs " + std::to_string(needed) + " bytes on GPU " + std::to_string(deviceIndex) + " but only " +
                                             std::to_string(freeBytes) + " bytes are free; free GPU memory (unload a model, or lower --keep-versions) " +
                                             "or name fewer tensors in begin_update");
  }
}

// The descriptor a segment exported, duplicated: the segment closes its own when it goes, so the
// caller's copy is then the daemon's only reference to the memory.
int dupExported(VmmSegment& segment) { return dupFd(segment.exportFd()); }

// A staging allocation of `size` bytes (a whole number of the device's granules) on the current
// context's device, judged against the GPU's free memory under the allocation lock.
VmmSegment stagingSegment(int deviceIndex, CUdevice dev, uint64_t size, const std::string& what) {
  std::lock_guard<std::mutex> hold(allocating);
  checkFree(deviceIndex, size, what);
  return VmmSegment::create(dev, size);
}

}  // namespace

int cudaStagingFresh(int deviceIndex, uint64_t bytes) {
  if (bytes == 0) throw DeviceError("E_BAD_PLAN", "a segment of zero bytes cannot be made");
  PrimaryContext context(deviceIndex);
  ScopedContext current(context.get());
  CUdevice dev = cudaDeviceAt(deviceIndex);
  VmmSegment staging = stagingSegment(deviceIndex, dev, vmmSegmentSize(dev, bytes), "a fresh writable segment of " + std::to_string(bytes) + " bytes");
  return dupExported(staging);
}

int cudaStagingCopy(int deviceIndex, int sourceFd, uint64_t bytes) {
  if (bytes == 0) throw DeviceError("E_BAD_PLAN", "a segment of zero bytes cannot be copied");
  PrimaryContext context(deviceIndex);
  ScopedContext current(context.get());
  CUdevice dev = cudaDeviceAt(deviceIndex);
  uint64_t size = vmmSegmentSize(dev, bytes);
  VmmSegment staging = stagingSegment(deviceIndex, dev, size, "a writable copy of a segment of " + std::to_string(bytes) + " bytes");
  VmmSegment source = VmmSegment::import(dev, sourceFd, size);
  Stream stream = createStream();
  cudaDriver().cuMemcpyDtoDAsync_v2(staging.pointer(), source.pointer(), size, stream.get());
  cudaDriver().cuStreamSynchronize(stream.get());
  return dupExported(staging);
}

CudaCommitted cudaCommitCopies(int deviceIndex, const std::vector<int>& fds, const std::vector<bool>& copied,
                               const std::vector<uint64_t>& bytes, std::vector<TensorRange> tensors, unsigned threads, bool onGpu) {
  if (fds.size() != copied.size() || fds.size() != bytes.size()) {
    throw DeviceError("E_BAD_PLAN", "cudaCommitCopies takes one descriptor, copied flag and size per segment");
  }
  PrimaryContext context(deviceIndex);
  ScopedContext current(context.get());
  CUdevice dev = cudaDeviceAt(deviceIndex);
  std::vector<uint64_t> sizes;
  uint64_t needed = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    sizes.push_back(vmmSegmentSize(dev, bytes[i]));
    if (copied[i]) needed += sizes.back();
  }
  // What the new version serves: fresh final allocations for the written segments, which only
  // this process ever maps (and writes, here, once), and the shared segments as they are.
  std::vector<VmmSegment> served(fds.size());
  {
    std::lock_guard<std::mutex> hold(allocating);
    checkFree(deviceIndex, needed, "committing the update's " + std::to_string(std::count(copied.begin(), copied.end(), true)) + " written segment(s)");
    for (size_t i = 0; i < fds.size(); ++i)
      if (copied[i]) served[i] = VmmSegment::create(dev, sizes[i]);
  }
  {
    // Declared before the stream, so that on a failure the stream is drained (its destructor)
    // before any staging mapping a queued copy reads is unmapped.
    std::vector<VmmSegment> staging;
    Stream stream = createStream();
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!copied[i]) {
        served[i] = VmmSegment::import(dev, fds[i], sizes[i]);
        continue;
      }
      staging.push_back(VmmSegment::import(dev, fds[i], sizes[i]));
      cudaDriver().cuMemcpyDtoDAsync_v2(served[i].pointer(), staging.back().pointer(), sizes[i], stream.get());
    }
    cudaDriver().cuStreamSynchronize(stream.get());
  }
  std::vector<CUdeviceptr> pointers;
  for (const VmmSegment& s : served) pointers.push_back(s.pointer());
  CudaCommitted out{{}, digestDeviceSegments(pointers, bytes, std::move(tensors), threads, onGpu)};
  try {
    for (size_t i = 0; i < fds.size(); ++i) out.fds.push_back(copied[i] ? dupExported(served[i]) : -1);
  } catch (...) {
    for (int fd : out.fds)
      if (fd >= 0) ::close(fd);
    throw;
  }
  return out;
}

}  // namespace weightd
