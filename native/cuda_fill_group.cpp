#include "cuda_fill_group.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

namespace weightd {

namespace {

// How often a waiting member looks at its own cancel flag: a worker thread being torn down
// cancels its fill and joins the thread that waits here.
constexpr auto kCancelPoll = std::chrono::milliseconds(20);
// Abandoned groups still waiting for a member that may never come (its worker died before it
// joined): kept so that a late member fails at once, but only the most recent ones. Each load
// has a fresh id, so an old one is never asked for again.
constexpr size_t kMaxAbandoned = 16;

struct Group {
  unsigned size = 0;
  // Members that will not fill (they adopted their kept shard: leaveFillGroup): the group's fill
  // runs once the others have joined.
  unsigned left = 0;
  unsigned expected() const { return size - left; }
  std::vector<FillMember> members;
  bool running = false;
  bool finished = false;
  std::string abandonedBy;  // set when a member left before the fill started
  // Members told of the abandonment (the one that left, those waiting, those arriving later):
  // once all `size` know, nobody can come asking for the group and it is forgotten.
  unsigned told = 0;
  std::exception_ptr error;
};

std::mutex registryMutex;
std::condition_variable registryChanged;
std::map<std::string, std::shared_ptr<Group>> groups;
std::deque<std::pair<std::string, std::weak_ptr<Group>>> abandoned;  // oldest first

DeviceError groupError(const std::string& code, const std::string& id, const std::string& what) {
  return DeviceError(code, "fill group " + id + ": " + what);
}

// Rethrows the group's error to one member: as it is to the member it concerns (or when it
// concerns none), and to the others as the failure of the fill they shared.
[[noreturn]] void rethrowFor(const Group& g, const FillMember& self, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const MemberFailure& f) {
    if (g.members[f.member()].control == self.control) throw;
    throw DeviceError(f.code(), std::string("the fill shared by this node's GPUs failed: ") + f.what());
  }
}

void forget(const std::string& id, const std::shared_ptr<Group>& g) {
  auto it = groups.find(id);
  if (it != groups.end() && it->second == g) groups.erase(it);
}

// Counts one more member told that the group was abandoned, and retires the id after the last.
// Called with registryMutex held.
void tellAbandoned(const std::string& id, const std::shared_ptr<Group>& g) {
  if (++g->told >= g->expected()) forget(id, g);
}

// The group of `id`, made with `size` members if it is new. Called with registryMutex held.
std::shared_ptr<Group> groupFor(const std::string& id, unsigned size) {
  std::shared_ptr<Group>& slot = groups[id];
  if (!slot) {
    slot = std::make_shared<Group>();
    slot->size = size;
  }
  if (slot->size != size) {
    throw groupError("E_BAD_GROUP", id, "joined as one of " + std::to_string(size) + " members, but it has " + std::to_string(slot->size));
  }
  return slot;
}

// Runs the group's fill for every member on the calling member's thread, then tells the others.
// Called with `lock` (registryMutex) held, which it releases while the fill runs.
void runFor(const std::string& id, const std::shared_ptr<Group>& g, const FillMember& self, const FillOptions& options, std::unique_lock<std::mutex>& lock) {
  g->running = true;
  lock.unlock();
  std::exception_ptr error;
  try {
    cudaFill(g->members, options);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  g->running = false;
  g->finished = true;
  g->error = error;
  // The waiting members hold the group itself; the id is retired (a later fill is a new group).
  forget(id, g);
  registryChanged.notify_all();
  if (error) rethrowFor(*g, self, error);
}

// Marks the group abandoned by `who`, the first member to leave it. Called with registryMutex held.
void abandon(const std::string& id, const std::shared_ptr<Group>& g, const std::string& who) {
  g->abandonedBy = who;
  abandoned.emplace_back(id, g);
  while (abandoned.size() > kMaxAbandoned) {
    if (auto old = abandoned.front().second.lock()) forget(abandoned.front().first, old);
    abandoned.pop_front();
  }
}

}  // namespace

void fillInGroup(const std::string& id, unsigned size, const FillMember& self, const FillOptions& options) {
  std::unique_lock<std::mutex> lock(registryMutex);
  std::shared_ptr<Group> g = groupFor(id, size);
  if (!g->abandonedBy.empty()) {
    tellAbandoned(id, g);
    throw groupError("E_FILL_CANCELLED", id, g->abandonedBy + " was cancelled before the group's fill started");
  }
  if (g->running || g->finished || g->members.size() >= g->expected()) {
    throw groupError("E_BAD_GROUP", id, "already has its " + std::to_string(g->expected()) + " members");
  }
  g->members.push_back(self);
  // The last to arrive runs the fill for everyone.
  if (g->members.size() == g->expected()) return runFor(id, g, self, options, lock);
  // Wait for the others, and say so (waitingForGroup) until they have all joined or this member
  // leaves. The members' FillMember structs (and what they point to) live on the stacks of their
  // callers, so no member returns while the fill runs: the fill sees a cancel through each
  // member's own flag and stops.
  struct Waiting {
    std::atomic<bool>& flag;
    explicit Waiting(std::atomic<bool>& f) : flag(f) { flag = true; }
    ~Waiting() { flag = false; }
  } waiting(self.control->waitingForGroup);
  for (;;) {
    registryChanged.wait_for(lock, kCancelPoll);
    if (g->running) waiting.flag = false;  // every member has joined: this one's copies are under way
    // The members still to come left instead (leaveFillGroup): the first to have joined runs it.
    if (!g->running && !g->finished && g->abandonedBy.empty() && g->members.size() == g->expected() && g->members.front().control == self.control) {
      waiting.flag = false;
      return runFor(id, g, self, options, lock);
    }
    if (g->finished) {
      if (g->error) rethrowFor(*g, self, g->error);
      return;
    }
    if (!g->abandonedBy.empty() && !g->running) {
      tellAbandoned(id, g);
      throw groupError("E_FILL_CANCELLED", id, g->abandonedBy + " was cancelled before the group's fill started");
    }
    if (!g->running && self.control->cancel.load()) {
      abandon(id, g, self.target.label.empty() ? "a member" : self.target.label);
      for (auto it = g->members.begin(); it != g->members.end(); ++it) {
        if (it->control == self.control) {
          g->members.erase(it);
          break;
        }
      }
      tellAbandoned(id, g);
      registryChanged.notify_all();
      throw DeviceError("E_FILL_CANCELLED", "fill cancelled before it finished");
    }
  }
}

void leaveFillGroup(const std::string& id, unsigned size) {
  std::lock_guard<std::mutex> lock(registryMutex);
  std::shared_ptr<Group> g = groupFor(id, size);
  if (g->running || g->finished || g->members.size() >= g->expected()) {
    throw groupError("E_BAD_GROUP", id, "cannot be left: its " + std::to_string(g->expected()) + " members have joined");
  }
  ++g->left;
  if (g->expected() == 0 || (!g->abandonedBy.empty() && g->told >= g->expected())) forget(id, g);
  registryChanged.notify_all();
}

}  // namespace weightd
