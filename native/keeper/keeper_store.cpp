#include "keeper_store.h"

#include <sys/syscall.h>
#include <unistd.h>

#include "process_liveness.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture (Linux 5.3)
#endif

namespace weightd::keeper {

void closeAll(std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  fds.clear();
}

Store::~Store() {
  for (auto& [key, record] : records_) closeAll(record.fds);
  for (auto& [pid, owner] : owners_) {
    if (owner.pidfd >= 0) ::close(owner.pidfd);
  }
}

void Store::keep(const Key& key, std::string blob, std::vector<int> fds, pid_t owner) {
  Record& r = records_[key];
  closeAll(r.fds);
  r = Record{std::move(blob), std::move(fds), Clock::now(), owner, true, std::nullopt};
  watch(owner);
  pruneOwners();
}

const Record* Store::find(const Key& key) const {
  auto it = records_.find(key);
  return it == records_.end() ? nullptr : &it->second;
}

void Store::take(const Key& key, pid_t taker) {
  auto it = records_.find(key);
  if (it == records_.end()) return;
  it->second.ownerPid = taker;
  it->second.ownerAlive = true;
  it->second.expiresAt.reset();
  watch(taker);
  pruneOwners();
}

uint32_t Store::drop(const std::string& device, const std::string& fingerprint) {
  uint32_t n = 0;
  for (auto it = records_.begin(); it != records_.end();) {
    bool match = device.empty() || (it->first.first == device && (fingerprint.empty() || it->first.second == fingerprint));
    if (!match) {
      ++it;
      continue;
    }
    closeAll(it->second.fds);
    it = records_.erase(it);
    ++n;
  }
  pruneOwners();
  return n;
}

std::vector<std::string> Store::fingerprintsOf(const std::string& device) const {
  std::vector<std::string> out;
  for (const auto& [key, record] : records_) {
    if (key.first == device) out.push_back(key.second);
  }
  return out;
}

size_t Store::fdCount() const {
  size_t n = 0;
  for (const auto& [key, record] : records_) n += record.fds.size();
  return n;
}

void Store::watch(pid_t pid) {
  if (pid <= 0 || owners_.count(pid)) return;
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  // ESRCH: gone already; tick() sees that. ENOSYS (before Linux 5.3) or EPERM under a seccomp
  // filter: the liveness rule once a second instead.
  owners_[pid] = Owner{fd, fd >= 0 ? std::nullopt : startTimeOf(pid)};
}

std::vector<std::pair<pid_t, int>> Store::ownerPidfds() const {
  std::vector<std::pair<pid_t, int>> out;
  for (const auto& [pid, owner] : owners_) {
    if (owner.pidfd >= 0) out.emplace_back(pid, owner.pidfd);
  }
  return out;
}

int Store::pollTimeoutMs() const {
  std::optional<Clock::time_point> next;
  for (const auto& [key, record] : records_) {
    if (record.expiresAt && (!next || *record.expiresAt < *next)) next = record.expiresAt;
  }
  int64_t ms = -1;
  if (next) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*next - Clock::now()).count() + 1;
    ms = left < 0 ? 0 : left;
  }
  for (const auto& [pid, owner] : owners_) {
    if (owner.pidfd < 0 && (ms < 0 || ms > 1000)) ms = 1000;
  }
  return ms > 1 << 30 ? 1 << 30 : static_cast<int>(ms);
}

void Store::startExpiry(pid_t pid, std::vector<StoreEvent>& events) {
  auto it = owners_.find(pid);
  if (it != owners_.end()) {
    if (it->second.pidfd >= 0) ::close(it->second.pidfd);
    owners_.erase(it);
  }
  Clock::time_point expires = Clock::now() + adoptWithin_;
  for (auto& [key, record] : records_) {
    if (record.ownerPid != pid || !record.ownerAlive) continue;
    record.ownerAlive = false;
    record.expiresAt = expires;
    events.push_back({"owner exited: the record expires unless taken within adopt-within", key.first, key.second, pid});
  }
}

std::vector<StoreEvent> Store::ownerExited(pid_t pid) {
  std::vector<StoreEvent> events;
  startExpiry(pid, events);
  return events;
}

std::vector<StoreEvent> Store::tick() {
  std::vector<StoreEvent> events;
  std::vector<pid_t> gone;
  for (const auto& [pid, owner] : owners_) {
    if (owner.pidfd < 0 && !isProcessAlive(pid, owner.startTime)) gone.push_back(pid);
  }
  for (pid_t pid : gone) startExpiry(pid, events);
  // Records whose owner pid was 0 (a peer in another pid namespace) have no one to wait for.
  Clock::time_point now = Clock::now();
  for (auto& [key, record] : records_) {
    if (record.ownerAlive && record.ownerPid <= 0) {
      record.ownerAlive = false;
      record.expiresAt = now + adoptWithin_;
    }
  }
  for (auto it = records_.begin(); it != records_.end();) {
    if (it->second.expiresAt && *it->second.expiresAt <= now) {
      events.push_back({"record expired: nobody took it within adopt-within; its memory is freed", it->first.first, it->first.second,
                        it->second.ownerPid});
      closeAll(it->second.fds);
      it = records_.erase(it);
    } else {
      ++it;
    }
  }
  return events;
}

void Store::pruneOwners() {
  for (auto it = owners_.begin(); it != owners_.end();) {
    bool named = false;
    for (const auto& [key, record] : records_) named = named || (record.ownerAlive && record.ownerPid == it->first);
    if (named) {
      ++it;
      continue;
    }
    if (it->second.pidfd >= 0) ::close(it->second.pidfd);
    it = owners_.erase(it);
  }
}

}  // namespace weightd::keeper
