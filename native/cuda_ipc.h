// Client side of the CUDA backend: opens the handles a daemon exported (legacy IPC handles, or
// descriptors of VMM memory: "cuda-fd"), so a TypeScript client (and the GPU tests) can map a
// daemon's arena and read it back. Owned by one addon instance: every worker thread has its own,
// and its destructor closes what it opened.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_resources.h"
#include "cuda_vmm.h"

namespace weightd {

std::string base64Encode(const void* data, size_t length);
// Throws E_BAD_HANDLE for anything but canonical padded base64.
std::vector<uint8_t> base64Decode(const std::string& text);

struct OpenedIpc {
  CUdeviceptr pointer = 0;
  uint64_t bytes = 0;  // size of the exporter's allocation
};

class CudaIpcClient {
 public:
  CudaIpcClient() = default;
  ~CudaIpcClient();
  CudaIpcClient(const CudaIpcClient&) = delete;
  CudaIpcClient& operator=(const CudaIpcClient&) = delete;
  // Maps the allocation behind a base64 legacy IPC handle on visible device `index`. A process
  // cannot open its own handles (the driver refuses): this is for other processes.
  OpenedIpc open(int index, const std::string& handleBase64);
  // Maps `bytes` of the VMM memory behind `fd` (a "cuda-fd" segment's descriptor) on visible
  // device `index`. The caller keeps `fd` and may close it at once. Each call is its own mapping.
  OpenedIpc openFd(int index, int fd, uint64_t bytes);
  // Undoes one open() (or openFd()) of `pointer`, unmapping it after the last; E_NOT_OPEN for anything else.
  void close(CUdeviceptr pointer);
  // Copies [offset, offset + length) of an opened mapping into `dst`; the range must lie inside it.
  void read(int index, CUdeviceptr pointer, uint64_t offset, uint64_t length, void* dst);

 private:
  struct Mapping {
    int index;
    std::shared_ptr<PrimaryContext> context;
    IpcMapping mapping;  // legacy IPC; empty for a descriptor's mapping
    VmmSegment vmm;      // "cuda-fd"; empty for legacy IPC
    uint64_t bytes;
    unsigned opens;
  };
  std::shared_ptr<PrimaryContext> contextFor(int index);
  static void closeMapping(Mapping& m);
  std::mutex mutex_;
  // Weak: a device's context is held by its open mappings only, and released with the last.
  std::map<int, std::weak_ptr<PrimaryContext>> contexts_;
  std::map<CUdeviceptr, Mapping> open_;
};

}  // namespace weightd
