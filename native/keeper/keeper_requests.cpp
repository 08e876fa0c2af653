#include "keeper_requests.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "keeper_wire.h"

namespace weightd::keeper {
namespace {

uint64_t msSince(Clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
  return ms < 0 ? 0 : static_cast<uint64_t>(ms);
}

uint32_t clampU32(uint64_t v) { return v > 0xffffffffu ? 0xffffffffu : static_cast<uint32_t>(v); }

// Closes the fds it holds when it goes out of scope unless they were handed on.
struct HeldFds {
  std::vector<int> fds;
  ~HeldFds() { closeAll(fds); }
};

std::vector<int> dupAll(const std::vector<int>& fds) {
  HeldFds dups;
  for (int fd : fds) {
    int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) {
      int err = errno;
      throw KeeperError("E_KEEPER_FDS", std::string("the keeper cannot duplicate a record's fd to send it: ") + std::strerror(err) +
                                            "; raise its RLIMIT_NOFILE (LimitNOFILE= in its unit)");
    }
    dups.fds.push_back(d);
  }
  return std::move(dups.fds);
}

// A record's bytes in a LIST reply (list() below): device, fingerprint, fdCount, ageMs, ownerPid,
// ownerAlive, expiresInMs, record.
size_t listEntryBytes(const Key& key, size_t blobBytes) { return 2 + key.first.size() + 2 + key.second.size() + 4 + 8 + 4 + 1 + 8 + 4 + blobBytes; }

// The LIST reply's frame once `key` holds a record of `blobBytes` (replacing any it holds).
size_t listFrameBytesWith(const Store& store, const Key& key, size_t blobBytes) {
  size_t n = kHeaderBytes + 1 + 4 + listEntryBytes(key, blobBytes);
  for (const auto& [k, rec] : store.records()) {
    if (k != key) n += listEntryBytes(k, rec.blob.size());
  }
  return n;
}

Reply keep(Store& store, Reader& r, HeldFds& held, pid_t peer) {
  std::string device = r.str("device");
  std::string fingerprint = r.str("fingerprint");
  std::string blob = r.blob("record");
  r.end();
  if (held.fds.empty()) {
    throw KeeperError("E_NO_FDS", "KEEP of " + device + " " + fingerprint + " came with no fds: a record holds the descriptors of its memory, attach them");
  }
  size_t listBytes = listFrameBytesWith(store, {device, fingerprint}, blob.size());
  if (listBytes > kMaxReplyBytes) {
    throw KeeperError("E_KEEPER_FULL", "KEEP of " + device + " " + fingerprint + " (a record of " + std::to_string(blob.size()) + " bytes) would make the keeper's LIST reply " +
                                           std::to_string(listBytes) + " bytes, more than the " + std::to_string(kMaxReplyBytes) + " a client reads; it holds " +
                                           std::to_string(store.records().size()) + " records: drop those no longer needed (weightd keeper status lists them)");
  }
  store.keep({device, fingerprint}, std::move(blob), std::move(held.fds), peer);
  held.fds.clear();
  return {okReply().frame(), {}, "kept", device, fingerprint};
}

Reply take(Store& store, Reader& r, pid_t peer) {
  std::string device = r.str("device");
  std::string fingerprint = r.str("fingerprint");
  r.end();
  const Record* found = store.find({device, fingerprint});
  if (!found) {
    std::vector<std::string> kept = store.fingerprintsOf(device);
    std::string list;
    for (const std::string& f : kept) list += (list.empty() ? "" : ", ") + f;
    std::string message = "no record of fingerprint " + fingerprint + " for device " + device +
                          (kept.empty() ? "; nothing is kept for that device" : "; kept for it: " + list);
    return {errorFrame("E_NOT_KEPT", message), {}, "", device, fingerprint};
  }
  // Duplicated before the taker owns it: a TAKE the keeper cannot answer (its fd limit) leaves the
  // record as it was, its owner's and its expiry running, rather than owned by a daemon that got
  // nothing of it.
  std::vector<int> dups = dupAll(found->fds);
  store.take({device, fingerprint}, peer);
  return {okReply().blob(found->blob).u32(clampU32(msSince(found->keptAt))).frame(), std::move(dups), "taken", device, fingerprint};
}

Reply drop(Store& store, Reader& r) {
  std::string device = r.str("device");
  std::string fingerprint = r.str("fingerprint");
  r.end();
  uint32_t n = store.drop(device, fingerprint);
  return {okReply().u32(n).frame(), {}, n ? "dropped" : "", device, fingerprint};
}

Reply list(const Store& store, Reader& r) {
  r.end();
  Writer w = okReply();
  w.u32(static_cast<uint32_t>(store.records().size()));
  Clock::time_point now = Clock::now();
  for (const auto& [key, rec] : store.records()) {
    uint64_t expiresIn = 0;
    if (rec.expiresAt) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*rec.expiresAt - now).count();
      expiresIn = ms < 1 ? 1 : static_cast<uint64_t>(ms);  // 0 means owned: an expired record is freed on the next tick
    }
    w.str(key.first).str(key.second).u32(static_cast<uint32_t>(rec.fds.size())).u64(msSince(rec.keptAt))
        .u32(static_cast<uint32_t>(rec.ownerPid)).u8(rec.ownerAlive ? 1 : 0).u64(expiresIn).blob(rec.blob);
  }
  return {w.frame(), {}, "", "", ""};
}

Reply ping(const Store& store, const KeeperInfo& keeper, Reader& r) {
  r.end();
  return {okReply().u32(static_cast<uint32_t>(keeper.pid)).u32(kProtocolVersion).u32(static_cast<uint32_t>(store.records().size()))
              .u32(static_cast<uint32_t>(store.fdCount())).u64(msSince(keeper.started)).frame(),
          {}, "", "", ""};
}

}  // namespace

Reply handleRequest(Store& store, const KeeperInfo& keeper, Connection& from, Request request, size_t watchers) {
  HeldFds held{std::move(request.fds)};
  Reader r(request.payload.data(), request.payload.size());
  uint8_t op = r.u8("op");
  if (op != static_cast<uint8_t>(Op::Keep) && !held.fds.empty()) {
    throw KeeperError("E_UNEXPECTED_FDS", "op " + std::to_string(op) + " came with " + std::to_string(held.fds.size()) + " fds; only KEEP (1) carries fds");
  }
  switch (static_cast<Op>(op)) {
    case Op::Keep: return keep(store, r, held, from.peerPid());
    case Op::Take: return take(store, r, from.peerPid());
    case Op::Drop: return drop(store, r);
    case Op::List: return list(store, r);
    case Op::Ping: return ping(store, keeper, r);
    case Op::Watch:
      r.end();
      if (watchers >= kMaxWatchers) {
        throw KeeperError("E_TOO_MANY_WATCHERS", std::to_string(watchers) + " connections watch this keeper already, its most (" + std::to_string(kMaxWatchers) +
                                                     "); one daemon needs one: stop the processes that leave WATCH connections open");
      }
      from.watching = true;
      return {};
  }
  throw KeeperError("E_UNKNOWN_OP", "unknown op " + std::to_string(op) + ": the keeper knows KEEP 1, TAKE 2, DROP 3, LIST 4, PING 5, WATCH 6");
}

}  // namespace weightd::keeper
