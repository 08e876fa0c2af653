// The records the keeper holds, keyed by (device uuid, fingerprint): the daemon's opaque blob,
// the descriptors of the memory it describes, and who owns it. An owner is a process: when it
// exits (seen through its pidfd, or kill(pid, 0) where pidfd_open is missing) the record's
// expiry starts, and a record nobody takes within adopt-within is freed, its fds closed.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace weightd::keeper {

using Clock = std::chrono::steady_clock;

struct Record {
  std::string blob;
  std::vector<int> fds;  // owned: closed when the record is replaced, dropped or freed
  Clock::time_point keptAt;
  pid_t ownerPid = 0;
  bool ownerAlive = false;
  std::optional<Clock::time_point> expiresAt;  // set while no live owner
};

using Key = std::pair<std::string, std::string>;  // device, fingerprint

// Something the log should tell: the store reports, main logs.
struct StoreEvent {
  std::string msg;
  std::string device;
  std::string fingerprint;
  pid_t pid;
};

class Store {
 public:
  explicit Store(std::chrono::milliseconds adoptWithin) : adoptWithin_(adoptWithin) {}
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store();

  // Takes ownership of `fds`; replaces (closing the old fds of) a record of the same key.
  void keep(const Key& key, std::string blob, std::vector<int> fds, pid_t owner);
  // The record, as kept; nullptr when none is.
  const Record* find(const Key& key) const;
  // The record of `key` (find's) is now owned by `taker`, its expiry cancelled; nothing when none is kept.
  void take(const Key& key, pid_t taker);
  // device "" drops every record; fingerprint "" every record of the device. Returns how many.
  uint32_t drop(const std::string& device, const std::string& fingerprint);
  // The fingerprints kept for `device`, for E_NOT_KEPT's message.
  std::vector<std::string> fingerprintsOf(const std::string& device) const;

  const std::map<Key, Record>& records() const { return records_; }
  size_t fdCount() const;

  // Poll set: the pidfds of live owners (the keeper's loop polls them for POLLIN).
  std::vector<std::pair<pid_t, int>> ownerPidfds() const;
  // How long the loop may sleep: until the next expiry, or a second while an owner has no
  // pidfd; -1 for no limit.
  int pollTimeoutMs() const;
  // Called when `pid`'s pidfd is readable (it exited), and after every wake-up: checks the
  // owners without pidfds, starts expiries and frees what has expired.
  std::vector<StoreEvent> ownerExited(pid_t pid);
  std::vector<StoreEvent> tick();

 private:
  void watch(pid_t pid);
  void startExpiry(pid_t pid, std::vector<StoreEvent>& events);
  // Closes the pidfds of owners no record names any more.
  void pruneOwners();

  std::chrono::milliseconds adoptWithin_;
  std::map<Key, Record> records_;
  // An owner's pidfd, or -1 where pidfd_open is unavailable (before Linux 5.3, or refused by a
  // seccomp filter): then polled once a second by the liveness rule, with the start time read
  // when it was first watched, so a zombie or a reused pid is not taken for the owner.
  struct Owner {
    int pidfd = -1;
    std::optional<std::string> startTime;
  };
  std::map<pid_t, Owner> owners_;
};

void closeAll(std::vector<int>& fds);

}  // namespace weightd::keeper
