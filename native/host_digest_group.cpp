#include "host_digest_group.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "device.h"
#include "file_reader.h"
#include "fill_group_registry.h"
#include "read_ranges.h"
#include "unix_fds.h"

namespace weightd {

struct DigestGroup {
  unsigned size = 0;
  unsigned left = 0;      // members that will not fill (leaveDigestGroup)
  unsigned joined = 0;
  unsigned offered = 0;   // members that offered their rows (offerRows): they copy from then on
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

  // Row-parallel chunks read once for every member (RowsPlan). Keyed by the tensor: its file and
  // first byte; a claim also by the chunk's first row.
  struct RowsOffer {
    unsigned member = 0;
    int fd = -1;  // one of `dups`
    uint32_t segment = 0;
    uint64_t dstOffset = 0;
    uint64_t rowBytes = 0;
    uint64_t colOffset = 0;
    uint64_t srcPitch = 0;
    uint64_t rows = 0;
    uint64_t rowsPerChunk = 0;
  };
  std::vector<TensorRange> sortedTensors;  // by (file, start): which tensor an op's rows belong to
  std::map<std::pair<uint32_t, uint64_t>, std::vector<RowsOffer>> rowsOffers;
  // Each chunk planned so far: the members whose columns its first planner writes.
  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, std::vector<unsigned>> rowsClaims;
  // Members joined and not yet gone: the duplicates are closed when the last one goes, once no
  // member can be writing into them.
  unsigned active = 0;
  std::vector<int> dups;
  void closeDups() {
    for (int fd : dups) ::close(fd);
    dups.clear();
  }
  ~DigestGroup() { closeDups(); }
};

namespace {

// A chunk's whole rows are read into one buffer to be delivered only up to this size; a longer
// one (a single very long row) is read by each member, its own columns.
constexpr uint64_t kMaxDeliveredSpanBytes = 16ull << 20;

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

// The checkpoint tensor whose rows `op` copies columns of, when its rows cover that tensor's rows
// whole and its columns lie inside a row; else nullptr. `sorted` is by (file, start).
const TensorRange* rowsTensor(const std::vector<TensorRange>& sorted, const CopyOp& op) {
  if (op.rows < 2 || op.srcPitch == 0) return nullptr;
  auto after = std::upper_bound(sorted.begin(), sorted.end(), std::make_pair(op.file, op.srcOffset),
                                [](const std::pair<uint32_t, uint64_t>& k, const TensorRange& t) { return k < std::make_pair(t.file, t.start); });
  if (after == sorted.begin()) return nullptr;
  const TensorRange& t = *(after - 1);
  uint64_t col = op.srcOffset - t.start;
  if (t.file != op.file || col + op.rowBytes > op.srcPitch || t.end - t.start != op.rows * op.srcPitch) return nullptr;
  return &t;
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
    g->sortedTensors = tensors;
    std::sort(g->sortedTensors.begin(), g->sortedTensors.end(),
              [](const TensorRange& a, const TensorRange& b) { return std::make_pair(a.file, a.start) < std::make_pair(b.file, b.start); });
  } else if (g->files != files || !sameTensors(g->tensors, tensors)) {
    // Every rank of a plan digests the same tensors of the same files (RankPlan.contentTensors).
    fail(id, g, "a member's files or tensors differ from the first member's");
    throw registry.error("E_BAD_GROUP", id, "this member's files or tensors differ from the first member's; every rank of one plan digests the same tensors");
  }
  index_ = g->joined - 1;
  ++g->active;
  group_ = std::move(g);
}

DigestGroupMember::~DigestGroupMember() {
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (!finished_) fail(id_, group_, "another rank's fill failed or was cancelled before it finished");
  // The last member gone: none writes into another's arena any more.
  if (--group_->active == 0) group_->closeDups();
}

void DigestGroupMember::offerRows(const std::vector<CopyOp>& ops, const std::vector<int>& segmentFds, uint64_t chunkBytes) {
  std::lock_guard<std::mutex> lock(registry.mutex);
  DigestGroup& g = *group_;
  // Each eligible op by its tensor; a tensor this member copies in more than one op (none does
  // today) is not offered: a claim names one.
  std::map<std::pair<uint32_t, uint64_t>, std::vector<const CopyOp*>> opsOf;
  for (const CopyOp& op : ops)
    if (const TensorRange* t = readsRowsApart(op) && op.segment < segmentFds.size() ? rowsTensor(g.sortedTensors, op) : nullptr) opsOf[{t->file, t->start}].push_back(&op);
  std::map<uint32_t, int> dupOf;  // segment -> the group's duplicate
  for (const auto& [tensor, its] : opsOf) {
    if (its.size() != 1) continue;
    const CopyOp& op = *its.front();
    auto dup = dupOf.find(op.segment);
    if (dup == dupOf.end()) {
      g.dups.push_back(dupFd(segmentFds[op.segment]));
      dup = dupOf.emplace(op.segment, g.dups.back()).first;
    }
    g.rowsOffers[tensor].push_back(
        DigestGroup::RowsOffer{index_, dup->second, op.segment, op.dstOffset, op.rowBytes, op.srcOffset - tensor.second, op.srcPitch, op.rows, rowsPerChunk(op, chunkBytes)});
  }
  ++g.offered;
  registry.changed.notify_all();
}

RowsPlan DigestGroupMember::planRows(const CopyOp& op, const Chunk& c, FillControl& control) {
  std::unique_lock<std::mutex> lock(registry.mutex);
  DigestGroup& g = *group_;
  RowsPlan plan;
  // Whoever plans a chunk first must know every member it can write for. These chunks come last
  // in each member's fill (HostDevice::fill), so a member that starts a little later has long
  // offered its rows by then, and this waits only for one that has not started at all.
  if (g.offered + g.left < g.size && g.failure.empty()) {
    WaitingForGroup waiting(control.waitingForGroup);
    while (g.offered + g.left < g.size && g.failure.empty()) {
      if (control.cancel.load()) throw DeviceError("E_FILL_CANCELLED", "fill cancelled before it finished");
      registry.changed.wait_for(lock, kGroupCancelPoll);
    }
  }
  const TensorRange* t = g.failure.empty() ? rowsTensor(g.sortedTensors, op) : nullptr;
  if (!t) return plan;
  auto offers = g.rowsOffers.find({t->file, t->start});
  if (offers == g.rowsOffers.end()) return plan;
  auto mine = std::find_if(offers->second.begin(), offers->second.end(), [&](const DigestGroup::RowsOffer& o) { return o.member == index_; });
  if (mine == offers->second.end()) return plan;
  auto [claim, first] = g.rowsClaims.try_emplace({t->file, t->start, c.firstRow});
  std::vector<unsigned>& delivered = claim->second;
  if (!first) {
    if (std::find(delivered.begin(), delivered.end(), index_) != delivered.end()) plan.kind = RowsPlan::Kind::Skip;
    return plan;
  }
  // The first to reach this chunk: it writes the columns of every member that cuts the tensor
  // at the same rows (its chunk is this one), and they skip it; past the span's bound, or with
  // nobody to write for, it reads for itself and the others read their own columns too.
  uint64_t spanBytes = c.rowCount * op.srcPitch;
  if (spanBytes > kMaxDeliveredSpanBytes) return plan;
  for (const DigestGroup::RowsOffer& o : offers->second) {
    // Its chunk is this one only where it cuts the same rows of the same pitch.
    if (o.member == index_ || o.rowsPerChunk != mine->rowsPerChunk || o.srcPitch != mine->srcPitch || o.rows != mine->rows) continue;
    delivered.push_back(o.member);
    plan.dests.push_back(RowsPlan::Dest{o.fd, o.segment, o.dstOffset + c.firstRow * o.rowBytes, o.rowBytes, o.colOffset});
  }
  if (delivered.empty()) return plan;
  plan.kind = RowsPlan::Kind::Deliver;
  plan.spanStart = t->start + c.firstRow * op.srcPitch;
  plan.spanBytes = spanBytes;
  plan.colOffset = mine->colOffset;
  return plan;
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
