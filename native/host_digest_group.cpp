#include "host_digest_group.h"

#include <atomic>
#include <mutex>

#include "device.h"
#include "fill_group_registry.h"

namespace weightd {

struct DigestGroup {
  unsigned size = 0;
  unsigned left = 0;      // members that will not fill (leaveDigestGroup)
  unsigned joined = 0;
  unsigned finished = 0;  // members whose copies are done
  unsigned expected() const { return size - left; }
  // Every member has joined or left: none can come asking for the group any more.
  bool allCame() const { return joined + left >= size; }
  std::vector<std::string> files;
  std::vector<TensorRange> tensors;
  std::unique_ptr<ContentDigests> digests;
  bool hashingRest = false;
  // While hashingRest: the cancel flag of the member reading the rest, which a waiting member
  // that is cancelled sets too, so that its worker's teardown does not wait for that read.
  std::atomic<bool>* restCancel = nullptr;
  bool done = false;
  std::string failure;  // why the group failed; empty while it has not
  std::vector<std::string> result;
};

namespace {

// Failed groups are kept for the members still to come (GroupRegistry::keepEnded).
GroupRegistry<DigestGroup> registry("digest group");

// A failed group is forgotten once every member has joined or left (none can come asking), or
// once it is not among the GroupRegistry::kMaxEnded most recent. Called with registry.mutex held.
void forgetIfAllCame(const std::string& id, const std::shared_ptr<DigestGroup>& g) {
  if (g->allCame()) registry.forget(id, g);
}

void fail(const std::string& id, const std::shared_ptr<DigestGroup>& g, const std::string& why) {
  if (!g->failure.empty() || g->done) return;
  g->failure = why;
  registry.keepEnded(id, g);
  forgetIfAllCame(id, g);
  registry.changed.notify_all();
}

bool sameTensors(const std::vector<TensorRange>& a, const std::vector<TensorRange>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].file != b[i].file || a[i].start != b[i].start || a[i].end != b[i].end) return false;
  }
  return true;
}

}  // namespace

DigestGroupMember::DigestGroupMember(const std::string& id, unsigned size, const std::vector<std::string>& files, const std::vector<TensorRange>& tensors,
                                     const FileSet& fileSet)
    : id_(id) {
  std::lock_guard<std::mutex> lock(registry.mutex);
  std::shared_ptr<DigestGroup> g = registry.groupFor(id, size);
  if (g->allCame()) throw registry.error("E_BAD_GROUP", id, "already has its " + std::to_string(g->size) + " members");
  ++g->joined;
  if (!g->failure.empty()) {
    forgetIfAllCame(id, g);
    throw registry.error("E_FILL_CANCELLED", id, g->failure);
  }
  if (!g->digests) {
    try {
      g->digests = std::make_unique<ContentDigests>(tensors, fileSet);
    } catch (const std::exception& e) {
      fail(id, g, std::string("its first member's tensors were refused: ") + e.what());
      throw;
    }
    g->files = files;
    g->tensors = tensors;
  } else if (g->files != files || !sameTensors(g->tensors, tensors)) {
    // Every rank of a plan digests the same tensors of the same files (RankPlan.contentTensors).
    fail(id, g, "a member's files or tensors differ from the first member's");
    throw registry.error("E_BAD_GROUP", id, "this member's files or tensors differ from the first member's; every rank of one plan digests the same tensors");
  }
  group_ = std::move(g);
}

DigestGroupMember::~DigestGroupMember() {
  if (finished_) return;
  std::lock_guard<std::mutex> lock(registry.mutex);
  fail(id_, group_, "another rank's fill failed or was cancelled before it finished");
}

ContentDigests& DigestGroupMember::digests() { return *group_->digests; }

void DigestGroupMember::finish(const FileSet& fileSet, unsigned threads, FillControl& control) {
  DigestGroup& g = *group_;
  std::unique_lock<std::mutex> lock(registry.mutex);
  ++g.finished;
  WaitingForGroup waiting(control.waitingForGroup);
  for (;;) {
    if (!g.failure.empty()) throw registry.error("E_FILL_CANCELLED", id_, g.failure);
    if (g.done) {
      control.digests = g.result;
      control.digestRereadBytes = 0;
      finished_ = true;
      return;
    }
    if (!g.hashingRest && g.finished == g.expected()) {
      // Every member's copies are done: this one reads what none of them covered.
      g.hashingRest = true;
      g.restCancel = &control.cancel;
      waiting.stop();
      lock.unlock();
      uint64_t reread;
      try {
        reread = g.digests->hashRest(fileSet, threads, control.cancel);  // throws when cancelled
      } catch (...) {
        lock.lock();
        g.restCancel = nullptr;
        throw;
      }
      std::vector<std::string> result = g.digests->tensorDigests();
      lock.lock();
      g.restCancel = nullptr;
      g.result = result;
      g.done = true;
      forgetIfAllCame(id_, group_);
      registry.changed.notify_all();
      control.digests = std::move(result);
      control.digestRereadBytes = reread;
      finished_ = true;
      return;
    }
    if (control.cancel.load()) {
      // A member reading the rest for the group stops too: the group fails with this member.
      if (g.restCancel) *g.restCancel = true;
      throw DeviceError("E_FILL_CANCELLED", "fill cancelled before it finished");
    }
    registry.changed.wait_for(lock, kGroupCancelPoll);
  }
}

void leaveDigestGroup(const std::string& id, unsigned size) {
  std::lock_guard<std::mutex> lock(registry.mutex);
  std::shared_ptr<DigestGroup> g = registry.groupFor(id, size);
  if (g->allCame()) throw registry.error("E_BAD_GROUP", id, "cannot be left: its " + std::to_string(g->size) + " members have come");
  ++g->left;
  if (g->expected() == 0 || (!g->failure.empty() && g->allCame())) registry.forget(id, g);
  registry.changed.notify_all();
}

}  // namespace weightd
