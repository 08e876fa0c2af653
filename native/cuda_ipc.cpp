#include "cuda_ipc.h"

#include <cstring>

namespace weightd {

namespace {
const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64Encode(const void* data, size_t length) {
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  out.reserve((length + 2) / 3 * 4);
  for (size_t i = 0; i < length; i += 3) {
    uint32_t v = static_cast<uint32_t>(p[i]) << 16;
    if (i + 1 < length) v |= static_cast<uint32_t>(p[i + 1]) << 8;
    if (i + 2 < length) v |= p[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < length ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < length ? kAlphabet[v & 63] : '=';
  }
  return out;
}

std::vector<uint8_t> base64Decode(const std::string& text) {
  auto bad = [&]() {
    return DeviceError("E_BAD_HANDLE", "IPC handle is not valid base64 (" + std::to_string(text.size()) +
                                           " characters); pass the handle string exactly as the daemon exported it");
  };
  if (text.size() % 4 != 0) throw bad();
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      char c = text[i + k];
      const char* at = c ? strchr(kAlphabet, c) : nullptr;
      // Padding only in the last group's last two places.
      if (c == '=' && i + 4 == text.size() && k >= 2 && (k == 3 || text[i + 3] == '=')) {
        ++pad;
        v <<= 6;
      } else if (at && pad == 0) {
        v = (v << 6) | static_cast<uint32_t>(at - kAlphabet);
      } else {
        throw bad();
      }
    }
    out.push_back(static_cast<uint8_t>(v >> 16));
    if (pad < 2) out.push_back(static_cast<uint8_t>(v >> 8));
    if (pad < 1) out.push_back(static_cast<uint8_t>(v));
  }
  return out;
}

CudaIpcClient::~CudaIpcClient() {
  for (auto& [pointer, m] : open_) closeMapping(m);
}

void CudaIpcClient::closeMapping(Mapping& m) {
  try {
    ScopedContext current(m.context->get());
    m.mapping.reset();
    m.vmm.reset();
  } catch (const DeviceError&) {
    m.mapping.reset();  // best effort: the driver is failing and this runs from destructors
    m.vmm.reset();
  }
}

std::shared_ptr<PrimaryContext> CudaIpcClient::contextFor(int index) {
  std::shared_ptr<PrimaryContext> ctx = contexts_[index].lock();
  if (!ctx) {
    ctx = std::make_shared<PrimaryContext>(index);
    contexts_[index] = ctx;
  }
  return ctx;
}

OpenedIpc CudaIpcClient::open(int index, const std::string& handleBase64) {
  std::vector<uint8_t> bytes = base64Decode(handleBase64);
  CUipcMemHandle handle{};
  if (bytes.size() != sizeof handle.reserved) {
    throw DeviceError("E_BAD_HANDLE", "IPC handle decodes to " + std::to_string(bytes.size()) + " bytes, not the " +
                                          std::to_string(sizeof handle.reserved) + " of a CUDA IPC handle; is it from the cuda backend?");
  }
  memcpy(handle.reserved, bytes.data(), bytes.size());
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<PrimaryContext> context = contextFor(index);
  ScopedContext current(context->get());
  const CudaDriver& drv = cudaDriver();
  CUdeviceptr p = 0;
  drv.cuIpcOpenMemHandle_v2(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  IpcMapping mapping(p);
  CUdeviceptr base = 0;
  size_t size = 0;
  drv.cuMemGetAddressRange_v2(&base, &size, p);
  // The same handle opened twice maps to the same address: keep one driver mapping (the
  // extra driver reference goes with `mapping` now) and count the opens, so each close()
  // matches one open().
  auto it = open_.find(p);
  if (it != open_.end()) {
    ++it->second.opens;
    return OpenedIpc{p, it->second.bytes};
  }
  open_.emplace(p, Mapping{index, context, std::move(mapping), VmmSegment(), size, 1});
  return OpenedIpc{p, size};
}

OpenedIpc CudaIpcClient::openFd(int index, int fd, uint64_t bytes) {
  if (fd < 0 || bytes == 0) {
    throw DeviceError("E_BAD_HANDLE", "a cuda-fd segment needs an open descriptor and a size, not fd " + std::to_string(fd) + " of " +
                                          std::to_string(bytes) + " bytes; pass what get_segment_fds returned");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<PrimaryContext> context = contextFor(index);
  ScopedContext current(context->get());
  CUdevice dev = cudaDeviceAt(index);
  VmmSegment vmm = VmmSegment::import(dev, fd, vmmSegmentSize(dev, bytes));
  CUdeviceptr p = vmm.pointer();
  open_.emplace(p, Mapping{index, context, IpcMapping(), std::move(vmm), bytes, 1});
  return OpenedIpc{p, bytes};
}

void CudaIpcClient::close(CUdeviceptr pointer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_.find(pointer);
  if (it == open_.end()) throw DeviceError("E_NOT_OPEN", "pointer " + std::to_string(pointer) + " is not an open IPC mapping of this thread");
  if (--it->second.opens > 0) return;
  ScopedContext current(it->second.context->get());
  it->second.mapping.reset();
  it->second.vmm.reset();
  open_.erase(it);
}

void CudaIpcClient::read(int index, CUdeviceptr pointer, uint64_t offset, uint64_t length, void* dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_.find(pointer);
  if (it == open_.end()) throw DeviceError("E_NOT_OPEN", "pointer " + std::to_string(pointer) + " is not an open IPC mapping of this thread");
  const Mapping& m = it->second;
  uint64_t end;
  if (m.index != index) {
    throw DeviceError("E_OUT_OF_RANGE", "pointer " + std::to_string(pointer) + " was opened on device " + std::to_string(m.index) +
                                            ", not " + std::to_string(index));
  }
  if (__builtin_add_overflow(offset, length, &end) || end > m.bytes) {
    throw DeviceError("E_OUT_OF_RANGE", "read of " + std::to_string(length) + " bytes at " + std::to_string(offset) +
                                            " is outside the " + std::to_string(m.bytes) + "-byte mapping");
  }
  if (length == 0) return;
  ScopedContext current(m.context->get());
  cudaDriver().cuMemcpyDtoH_v2(dst, pointer + offset, length);
}

}  // namespace weightd
