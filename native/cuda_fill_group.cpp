#include "cuda_fill_group.h"

#include <memory>
#include <mutex>

#include "fill_group_registry.h"

namespace weightd {

namespace {

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

// Abandoned groups (a member's worker died before the others joined) are kept for the members
// still to come (GroupRegistry::keepEnded).
GroupRegistry<Group> registry("fill group");

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

// Counts one more member told that the group was abandoned, and retires the id after the last.
// Called with registry.mutex held.
void tellAbandoned(const std::string& id, const std::shared_ptr<Group>& g) {
  if (++g->told >= g->expected()) registry.forget(id, g);
}

// Runs the group's fill for every member on the calling member's thread, then tells the others.
// Called with `lock` (registry.mutex) held, which it releases while the fill runs.
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
  registry.forget(id, g);
  registry.changed.notify_all();
  if (error) rethrowFor(*g, self, error);
}

// Marks the group abandoned by `who`, the first member to leave it. Called with registry.mutex held.
void abandon(const std::string& id, const std::shared_ptr<Group>& g, const std::string& who) {
  g->abandonedBy = who;
  registry.keepEnded(id, g);
}

}  // namespace

void fillInGroup(const std::string& id, unsigned size, const FillMember& self, const FillOptions& options) {
  std::unique_lock<std::mutex> lock(registry.mutex);
  std::shared_ptr<Group> g = registry.groupFor(id, size);
  if (!g->abandonedBy.empty()) {
    tellAbandoned(id, g);
    throw registry.error("E_FILL_CANCELLED", id, g->abandonedBy + " was cancelled before the group's fill started");
  }
  if (g->running || g->finished || g->members.size() >= g->expected()) {
    throw registry.error("E_BAD_GROUP", id, "already has its " + std::to_string(g->expected()) + " members");
  }
  g->members.push_back(self);
  // The last to arrive runs the fill for everyone.
  if (g->members.size() == g->expected()) return runFor(id, g, self, options, lock);
  // Wait for the others, and say so (waitingForGroup) until they have all joined or this member
  // leaves. The members' FillMember structs (and what they point to) live on the stacks of their
  // callers, so no member returns while the fill runs: the fill sees a cancel through each
  // member's own flag and stops.
  WaitingForGroup waiting(self.control->waitingForGroup);
  for (;;) {
    registry.changed.wait_for(lock, kGroupCancelPoll);
    if (g->running) waiting.stop();  // every member has joined: this one's copies are under way
    // The members still to come left instead (leaveFillGroup): the first to have joined runs it.
    if (!g->running && !g->finished && g->abandonedBy.empty() && g->members.size() == g->expected() && g->members.front().control == self.control) {
      waiting.stop();
      return runFor(id, g, self, options, lock);
    }
    if (g->finished) {
      if (g->error) rethrowFor(*g, self, g->error);
      return;
    }
    if (!g->abandonedBy.empty() && !g->running) {
      tellAbandoned(id, g);
      throw registry.error("E_FILL_CANCELLED", id, g->abandonedBy + " was cancelled before the group's fill started");
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
      registry.changed.notify_all();
      throw DeviceError("E_FILL_CANCELLED", "fill cancelled before it finished");
    }
  }
}

void leaveFillGroup(const std::string& id, unsigned size) {
  std::lock_guard<std::mutex> lock(registry.mutex);
  std::shared_ptr<Group> g = registry.groupFor(id, size);
  if (g->running || g->finished || g->members.size() >= g->expected()) {
    throw registry.error("E_BAD_GROUP", id, "cannot be left: its " + std::to_string(g->expected()) + " members have joined");
  }
  ++g->left;
  if (g->expected() == 0 || (!g->abandonedBy.empty() && g->told >= g->expected())) registry.forget(id, g);
  registry.changed.notify_all();
}

}  // namespace weightd
