// The groups that the fills of one process meet in (FillOptions.group: an id and a size), by id:
// the cuda ranks' one pass over the files (cuda_fill_group.h) and the host ranks' shared digests
// (host_digest_group.h) each keep one. A group is made by its first member to come (to join or
// to leave), held by its members meanwhile, and forgotten by whoever ends it.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "device.h"

namespace weightd {

// How often a member waiting in a group looks at its own cancel flag: a worker thread being torn
// down cancels its fill and joins the thread that waits.
constexpr auto kGroupCancelPoll = std::chrono::milliseconds(20);

// Says that a member waits for the others of its group (FillControl::waitingForGroup) while it
// lives, so that status shows a rank stuck there as waiting, not copying.
class WaitingForGroup {
 public:
  explicit WaitingForGroup(std::atomic<bool>& flag) : flag_(flag) { flag_ = true; }
  ~WaitingForGroup() { flag_ = false; }
  WaitingForGroup(const WaitingForGroup&) = delete;
  WaitingForGroup& operator=(const WaitingForGroup&) = delete;
  // It waits no more (the group's work is under way), though it has not returned yet.
  void stop() { flag_ = false; }

 private:
  std::atomic<bool>& flag_;
};

// `Group` has an `unsigned size`: its members, as the first to come said.
template <typename Group>
class GroupRegistry {
 public:
  // Groups that failed or were abandoned are kept so that a member arriving late fails at once
  // instead of waiting for members that are gone, but only the most recent ones: each load has a
  // fresh id, so an old one is never asked for again.
  static constexpr size_t kMaxEnded = 16;

  explicit GroupRegistry(std::string kind) : kind_(std::move(kind)) {}

  std::mutex mutex;
  std::condition_variable changed;

  DeviceError error(const std::string& code, const std::string& id, const std::string& what) const {
    return DeviceError(code, kind_ + " " + id + ": " + what);
  }

  // The group of `id`, made with `size` members if it is new; E_BAD_GROUP when it has another
  // size. With `mutex` held.
  std::shared_ptr<Group> groupFor(const std::string& id, unsigned size) {
    std::shared_ptr<Group>& slot = groups_[id];
    if (!slot) {
      slot = std::make_shared<Group>();
      slot->size = size;
    }
    if (slot->size != size) throw error("E_BAD_GROUP", id, "joined as one of " + std::to_string(size) + " members, but it has " + std::to_string(slot->size));
    return slot;
  }

  // With `mutex` held.
  void forget(const std::string& id, const std::shared_ptr<Group>& g) {
    auto it = groups_.find(id);
    if (it != groups_.end() && it->second == g) groups_.erase(it);
  }

  // Keeps a failed or abandoned group for its late members, forgetting the oldest beyond
  // kMaxEnded. With `mutex` held.
  void keepEnded(const std::string& id, const std::shared_ptr<Group>& g) {
    ended_.emplace_back(id, g);
    while (ended_.size() > kMaxEnded) {
      if (auto old = ended_.front().second.lock()) forget(ended_.front().first, old);
      ended_.pop_front();
    }
  }

 private:
  std::string kind_;
  std::map<std::string, std::shared_ptr<Group>> groups_;
  std::deque<std::pair<std::string, std::weak_ptr<Group>>> ended_;  // oldest first
};

}  // namespace weightd
