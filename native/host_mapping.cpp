#include "host_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "device.h"
#include "file_reader.h"
#include "sealed_memfd.h"

namespace weightd {

Napi::Value HostMappings::map(Napi::Env env, int fd, uint64_t bytes) {
  // An unsealed segment could be changed under the client's tensors, or shrunk under its
  // mapping (SIGBUS on the next read): whoever sent it is not a daemon serving sealed memory.
  std::string unsealed = servedSealsMissing(fd);
  if (!unsealed.empty()) throw DeviceError("E_SHM_OPEN", "descriptor " + std::to_string(fd) + " is " + unsealed + "; refusing to map it");
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    throw DeviceError("E_SHM_OPEN", "descriptor " + std::to_string(fd) + " holds " + std::to_string(st.st_size) + " bytes, fewer than the segment's " +
                                        std::to_string(bytes) + "; refusing to map it");
  }
  void* base = mapSealedReadOnly(fd, bytes);
  if (base == MAP_FAILED) throw DeviceError("E_SHM_MAP", "cannot map descriptor " + std::to_string(fd) + " (" + std::to_string(bytes) + " bytes): " + errnoMessage(errno));
  auto* hint = new FinalizeHint{state_};
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->live[base] = Mapping{bytes, hint};
  }
  return Napi::ArrayBuffer::New(
      env, base, bytes,
      [](Napi::Env, void* data, FinalizeHint* h) {
        release(*h->state, data, h);
        delete h;
      },
      hint);
}

void HostMappings::unmap(Napi::ArrayBuffer buffer) {
  void* base = buffer.Data();
  if (!buffer.IsDetached()) buffer.Detach();
  release(*state_, base, nullptr);
}

// owner == nullptr: an explicit unmap of a live buffer (its Data() is still its own mapping).
void HostMappings::release(State& state, void* base, const FinalizeHint* owner) {
  std::lock_guard<std::mutex> lock(state.mutex);
  auto it = state.live.find(base);
  if (it == state.live.end()) return;              // already unmapped explicitly
  if (owner && it->second.owner != owner) return;  // the address now belongs to a newer mapping
  munmap(base, it->second.bytes);
  state.live.erase(it);
}

}  // namespace weightd
