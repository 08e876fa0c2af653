// One request's meaning: decodes its payload, acts on the store and encodes the reply
// (docs/keeper.md lists the ops). Bad input throws KeeperError; the loop then replies with its
// code and closes the connection.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

#include "keeper_connection.h"
#include "keeper_store.h"

namespace weightd::keeper {

struct Reply {
  std::vector<uint8_t> frame;  // empty: no reply (WATCH)
  std::vector<int> fds;        // dups the connection sends and then closes
  std::string logMsg;          // an event worth an info line; empty for none
  std::string device, fingerprint;
};

struct KeeperInfo {
  pid_t pid;
  Clock::time_point started;
};

// WATCH connections are never idle (each is a daemon's for its life), so a full keeper never
// closes one to make room: without a bound of their own, a client that leaks them would take all
// of the keeper's connections and lock the daemon's KEEP and TAKE out. One daemon watches a
// keeper; a restart's overlap or a tool's watch fit many times over.
constexpr size_t kMaxWatchers = 16;

// Takes the request's fds: a KEEP's go to the store, any other's are closed. `watchers`: how many
// connections watch now (a WATCH past kMaxWatchers is refused).
Reply handleRequest(Store& store, const KeeperInfo& keeper, Connection& from, Request request, size_t watchers);

}  // namespace weightd::keeper
