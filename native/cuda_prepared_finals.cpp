#include "cuda_prepared_finals.h"

#include <map>
#include <mutex>

#include "cuda_resources.h"
#include "device.h"

namespace weightd {

namespace {

class KeptFinals final : public PreparedFinals {
 public:
  KeptFinals(int deviceIndex, std::vector<VmmSegment> segments) : deviceIndex_(deviceIndex), context_(deviceIndex), segments_(std::move(segments)) {}
  // Unmapped with the context that mapped them current, which this set holds retained until then.
  ~KeptFinals() override {
    ScopedContext current(context_.get());
    segments_.clear();
  }
  CUdeviceptr pointer(size_t segment) const override { return segment < segments_.size() ? segments_[segment].pointer() : 0; }
  int deviceIndex() const { return deviceIndex_; }
  size_t size() const { return segments_.size(); }

 private:
  int deviceIndex_;
  PrimaryContext context_;
  std::vector<VmmSegment> segments_;
};

std::mutex tableLock;
std::map<uint32_t, std::shared_ptr<KeptFinals>> table;
uint32_t lastId = 0;

}  // namespace

uint32_t keepPrepared(int deviceIndex, std::vector<VmmSegment> segments) {
  auto kept = std::make_shared<KeptFinals>(deviceIndex, std::move(segments));
  std::lock_guard<std::mutex> hold(tableLock);
  do ++lastId;
  while (lastId == 0 || table.count(lastId));
  table.emplace(lastId, std::move(kept));
  return lastId;
}

void cudaDropPrepared(uint32_t id) {
  std::shared_ptr<KeptFinals> dropped;
  {
    std::lock_guard<std::mutex> hold(tableLock);
    auto it = table.find(id);
    if (it == table.end()) return;
    dropped = std::move(it->second);
    table.erase(it);
  }
  // Unmapped here, outside the lock, unless a call still holds the set: then when it lets go.
}

std::shared_ptr<const PreparedFinals> preparedFinals(uint32_t id, int deviceIndex, size_t segments) {
  if (id == 0) return nullptr;
  std::lock_guard<std::mutex> hold(tableLock);
  auto it = table.find(id);
  if (it == table.end() || it->second->deviceIndex() != deviceIndex || it->second->size() != segments) {
    throw DeviceError("E_BAD_PLAN", "prepared finals " + std::to_string(id) + " are not kept for a layout of " + std::to_string(segments) + " segment(s) on GPU " +
                                        std::to_string(deviceIndex) + " (dropped with their update, or never made)");
  }
  return it->second;
}

}  // namespace weightd
