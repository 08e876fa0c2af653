#include "host_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "device.h"
#include "file_reader.h"

namespace weightd {

Napi::Value HostMappings::map(Napi::Env env, const std::string& path, uint64_t bytes) {
  struct stat st {};
  int fd = openRegularFile(path, O_NOFOLLOW, st, {"shared segment", "E_SHM_OPEN", "the daemon may have released it: ask for the state again"});
  if (static_cast<uint64_t>(st.st_size) < bytes || st.st_uid != geteuid()) {
    ::close(fd);
    throw DeviceError("E_SHM_OPEN", "shared segment " + path + " is not a segment of " + std::to_string(bytes) +
                                        " bytes owned by this user; refusing to map it");
  }
  void* base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the pages; the descriptor is not needed
  if (base == MAP_FAILED) throw DeviceError("E_SHM_MAP", "cannot map " + path + ": " + errnoMessage(err));
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
